// `explicit:0,3,7,12`: bounds given by the user, validated against the layer
// count and the number of parts.
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "pipeline/partition/partitioner.h"

namespace pp {
namespace {

absl::StatusOr<Bounds> PartitionExplicit(const PartitionRequest& request) {
  if (request.argument.empty()) {
    return absl::InvalidArgumentError(
        "partition method 'explicit' needs bounds: 'explicit:0,3,7,12' (part s owns [b[s], "
        "b[s+1]))");
  }
  Bounds bounds;
  for (absl::string_view item : absl::StrSplit(request.argument, ',')) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(item, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'explicit:", request.argument, "': '", item, "' is not an integer"));
    }
    bounds.push_back(value);
  }
  if (absl::Status s =
          ValidateBounds(bounds, static_cast<int64_t>(request.specs->size()), request.num_parts);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'explicit:", request.argument, "': ", s.message()));
  }
  return bounds;
}

}  // namespace

PP_REGISTER_PARTITIONER("explicit", "explicit:0,3,7,12 gives the bounds directly",
                        &PartitionExplicit);

}  // namespace pp
