// What a training run feeds the pipeline: the MicroBatchSource every rank
// reads its micro-batches from, and the LossFn the last stage applies. Models
// and data sets implement these without depending on the executor (c10d,
// p2p); StageExecutor and Trainer (stage_executor.h, trainer.h) consume them.
#ifndef PIPELINE_RUNTIME_MICRO_BATCH_SOURCE_H_
#define PIPELINE_RUNTIME_MICRO_BATCH_SOURCE_H_

#include <cstdint>
#include <functional>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "pipeline/layers/layer.h"

namespace pp {

// One micro-batch: the first stage's inputs plus the side inputs (labels,
// masks) with an id. Every rank reading (step, index) must get equal data.
struct MicroBatchData {
  Activations inputs;
  MicroBatch batch;
};

// A deterministic data source that every rank calls itself. `index` is the
// micro-batch's index within the global batch of the step (data-parallel
// replica d reads indices [d * m, (d + 1) * m)). Implementations must be
// deterministic in (step, index) and set batch.id uniquely per (step, index).
// Called from one thread per rank.
class MicroBatchSource {
 public:
  virtual ~MicroBatchSource() = default;
  virtual absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) = 0;
};

// The model's loss on the last stage: a scalar from the last stage's outputs
// and the micro-batch's side inputs (e.g. labels).
using LossFn = std::function<torch::Tensor(const Activations& outputs, const MicroBatch& batch)>;

}  // namespace pp

#endif  // PIPELINE_RUNTIME_MICRO_BATCH_SOURCE_H_
