// `uniform`: equal layer counts; the first n % p parts get one more layer.
#include "absl/strings/str_cat.h"
#include "pipeline/partition/partitioner.h"

namespace pp {
namespace {

absl::StatusOr<Bounds> PartitionUniform(const PartitionRequest& request) {
  if (!request.argument.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition method 'uniform' takes no argument, got '", request.argument, "'"));
  }
  return UniformBounds(static_cast<int64_t>(request.specs->size()), request.num_parts);
}

}  // namespace

PP_REGISTER_PARTITIONER("uniform", "equal layer counts; the first n % p parts get one more",
                        &PartitionUniform);

}  // namespace pp
