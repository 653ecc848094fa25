#include "pipeline/layers/layer_context.h"

#include "absl/strings/str_cat.h"

namespace pp {

LayerContext MakeLayerContext(const LayerEnvironment& environment, int64_t global_index,
                              uint64_t seed) {
  LayerContext context;
  context.global_index = global_index;
  context.seed = seed;
  context.model_parallel = environment.model_parallel;
  context.device = environment.device;
  context.param_dtype = environment.param_dtype;
  return context;
}

LayerEnvironment DenseEnvironment(const LayerEnvironment& environment) {
  LayerEnvironment dense;
  dense.device = environment.device;
  dense.param_dtype = environment.param_dtype;
  return dense;
}

std::string DescribeModelParallel(const ModelParallelGroup& group) {
  if (!group.is_parallel()) return "dense";
  return absl::StrCat("tp rank ", group.rank, " of ", group.size,
                      group.sequence_parallel ? " (sequence parallel)" : "");
}

}  // namespace pp
