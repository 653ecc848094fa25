// Range checks of configuration fields with messages that name the field, its
// value and the valid range ("parallelism.pp (0) must be at least 1 and at most
// 1024"). Shared by the driver's config validation and models' own.
#ifndef COMMON_FIELD_CHECKS_H_
#define COMMON_FIELD_CHECKS_H_

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pp {

inline constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

// An integer field within [lo, hi] (hi = kUnbounded: no upper bound); `why`
// says where a bound comes from. InvalidArgument otherwise.
absl::Status CheckIntField(absl::string_view name, int64_t value, int64_t lo, int64_t hi,
                           absl::string_view why = "");

// A real field, finite and within its interval: `open`/`close` are '(' / '['
// and ')' / ']' (open or closed ends); hi may be infinity.
absl::Status CheckRealField(absl::string_view name, double value, char open, double lo, double hi,
                            char close, absl::string_view why = "");

}  // namespace pp

#endif  // COMMON_FIELD_CHECKS_H_
