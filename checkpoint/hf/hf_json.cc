#include "checkpoint/hf/hf_json.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pp {
namespace {

// The field, or nullptr when absent or null.
const nlohmann::json* Find(const nlohmann::json& config, const char* field) {
  const auto it = config.find(field);
  return it == config.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

absl::StatusOr<int64_t> HfIntField(const nlohmann::json& config, const char* field, int64_t lo,
                                   int64_t hi, std::optional<int64_t> fallback) {
  const std::string range = absl::StrCat("must be an integer in [", lo, ", ", hi, "]");
  const nlohmann::json* value = Find(config, field);
  if (value == nullptr) {
    if (fallback.has_value()) return *fallback;
    return HfFieldError(field, nlohmann::json(), range);
  }
  // An unsigned beyond int64 would wrap in get<int64_t>().
  if (!value->is_number_integer() ||
      (value->is_number_unsigned() &&
       value->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
    return HfFieldError(field, *value, range);
  }
  const auto v = value->get<int64_t>();
  if (v < lo || v > hi) return HfFieldError(field, *value, range);
  return v;
}

absl::StatusOr<double> HfRealField(const nlohmann::json& config, const char* field, double fallback,
                                   bool positive) {
  const nlohmann::json* value = Find(config, field);
  if (value == nullptr) return fallback;
  const char* rule = positive ? "must be a finite number > 0" : "must be a finite number";
  if (!value->is_number()) return HfFieldError(field, *value, rule);
  const auto v = value->get<double>();
  if (!std::isfinite(v) || (positive && v <= 0)) return HfFieldError(field, *value, rule);
  return v;
}

absl::StatusOr<bool> HfBoolField(const nlohmann::json& config, const char* field, bool fallback) {
  const nlohmann::json* value = Find(config, field);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) return HfFieldError(field, *value, "must be true or false");
  return value->get<bool>();
}

absl::StatusOr<std::string> HfStringField(const nlohmann::json& config, const char* field,
                                          const std::string& fallback) {
  const nlohmann::json* value = Find(config, field);
  if (value == nullptr) return fallback;
  if (!value->is_string()) return HfFieldError(field, *value, "must be a string");
  return value->get<std::string>();
}

absl::Status HfFieldError(absl::string_view field, const nlohmann::json& value,
                          absl::string_view rule) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: ", field, " (", value.dump(), ") ", rule));
}

absl::StatusOr<nlohmann::json> ParseHfConfig(const std::string& json_text,
                                             absl::string_view model_type) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("config.json is not a JSON object");
  absl::StatusOr<std::string> type = HfStringField(j, "model_type", "");
  if (!type.ok()) return type.status();
  if (*type != model_type) {
    return HfFieldError("model_type", *type, absl::StrCat("must be \"", model_type, "\""));
  }
  return j;
}

}  // namespace pp
