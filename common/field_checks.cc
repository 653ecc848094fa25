#include "common/field_checks.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace pp {

absl::Status CheckIntField(absl::string_view name, int64_t value, int64_t lo, int64_t hi,
                           absl::string_view why) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  const bool unbounded = hi == kUnbounded;
  std::string rule;
  if (value < lo) {
    rule = lo == 0 ? "must not be negative" : absl::StrCat("must be at least ", lo);
    if (!unbounded) absl::StrAppend(&rule, " and at most ", hi);
  } else {
    rule = absl::StrCat("must be at most ", hi);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      name, " (", value, ") ", rule, why.empty() ? "" : " (", why, why.empty() ? "" : ")"));
}

absl::Status CheckRealField(absl::string_view name, double value, char open, double lo, double hi,
                            char close, absl::string_view why) {
  const bool above_lo = open == '(' ? value > lo : value >= lo;
  const bool below_hi = close == ')' ? value < hi : value <= hi;
  if (std::isfinite(value) && above_lo && below_hi) return absl::OkStatus();
  const std::string range = std::isinf(hi) ? absl::StrCat(open == '(' ? "> " : ">= ", lo)
                                           : absl::StrCat("in ", std::string(1, open), lo, ", ", hi,
                                                          std::string(1, close));
  return absl::InvalidArgumentError(absl::StrCat(name, " (", value, ") must be finite and ", range,
                                                 why.empty() ? "" : " (", why,
                                                 why.empty() ? "" : ")"));
}

}  // namespace pp
