// `parameters`: balance trainable parameter counts (min-max optimal). A spec's
// declared count is used as is; other layers are built, counted and freed one
// at a time, so counting never holds the whole model.
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "pipeline/partition/partitioner.h"

namespace pp {
namespace {

absl::StatusOr<Bounds> PartitionByParameters(const PartitionRequest& request) {
  if (!request.argument.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partition method 'parameters' takes no argument, got '", request.argument, "'"));
  }
  const std::vector<LayerSpec>& specs = *request.specs;
  std::vector<double> costs(specs.size());
  // Every position of a tie key holds (a copy of) the same module: count it
  // once per key and charge it to each position, as each stage holding the key
  // stores the parameters and their gradients.
  std::unordered_map<std::string, int64_t> tied_counts;
  absl::Status status = absl::OkStatus();
  try {
    for (size_t i = 0; i < specs.size(); ++i) {
      const LayerSpec& spec = specs[i];
      if (spec.is_tied()) {
        auto it = tied_counts.find(spec.tie_key());
        if (it == tied_counts.end()) {
          it = tied_counts.emplace(spec.tie_key(), SpecParameterCount(spec, i, request.base_seed))
                   .first;
        }
        costs[i] = static_cast<double>(it->second);
      } else {
        costs[i] = static_cast<double>(SpecParameterCount(spec, i, request.base_seed));
      }
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("counting parameters failed: ", ExceptionMessage(e)));
  }
  return BalancedBounds(costs, request.num_parts);
}

}  // namespace

PP_REGISTER_PARTITIONER("parameters",
                        "balance trainable parameter counts (layers built and freed one at a time "
                        "unless the spec declares its count)",
                        &PartitionByParameters);

}  // namespace pp
