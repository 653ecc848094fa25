// Typed reads of a Hugging Face config.json's fields: every value read from
// the file gets the type and range check a pipe config field gets (issue #42,
// class 3). A field of the wrong JSON type ("num_key_value_heads": "two"), a
// non-finite or out-of-range number is an InvalidArgument naming the field,
// its value and what would be valid, never an uncaught JSON exception or a
// division by zero further on.
#ifndef CHECKPOINT_HF_HF_JSON_H_
#define CHECKPOINT_HF_HF_JSON_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace pp {

// The bound of a size field (width, layers, heads, vocabulary) read here: far
// above any model, and low enough that products of two never overflow. The
// model's own validation then applies its tighter ranges.
inline constexpr int64_t kMaxHfDim = int64_t{1} << 30;

// An integer field in [lo, hi]; absent or null gives `fallback`, and is an
// error without one.
absl::StatusOr<int64_t> HfIntField(const nlohmann::json& config, const char* field, int64_t lo,
                                   int64_t hi, std::optional<int64_t> fallback = std::nullopt);

// A finite number (integer or real) > 0 when `positive`; absent or null
// gives `fallback`.
absl::StatusOr<double> HfRealField(const nlohmann::json& config, const char* field, double fallback,
                                   bool positive);

// A boolean; absent or null gives `fallback`.
absl::StatusOr<bool> HfBoolField(const nlohmann::json& config, const char* field, bool fallback);

// A string; absent or null gives `fallback`.
absl::StatusOr<std::string> HfStringField(const nlohmann::json& config, const char* field,
                                          const std::string& fallback);

// InvalidArgument "config.json: FIELD (VALUE) RULE", the form of every
// refusal of a field's value.
absl::Status HfFieldError(absl::string_view field, const nlohmann::json& value,
                          absl::string_view rule);

// `json_text` parsed as a config.json object whose "model_type" is
// `model_type`; InvalidArgument for anything else (not JSON, not an object,
// another model type).
absl::StatusOr<nlohmann::json> ParseHfConfig(const std::string& json_text,
                                             absl::string_view model_type);

}  // namespace pp

#endif  // CHECKPOINT_HF_HF_JSON_H_
