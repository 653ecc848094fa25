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

// The side input that marks a micro-batch's trained tokens (1) and the
// others (0: padding, prompts), shaped like its labels. A micro-batch that
// carries it asks for per-token loss normalisation (Megatron's
// calculate_per_token_loss): the loss function returns the SUM of the
// per-token losses over the mask, and the step's loss is
//   sum over every micro-batch of every data-parallel replica of that sum
//   ----------------------------------------------------------------------
//   global_loss_tokens (the mask's total over the whole global batch)
// so the gradient is the unpipelined run's for any split of the tokens over
// micro-batches and ranks (not a mean of micro-batch means).
inline constexpr char kLossMaskKey[] = "loss_mask";

// One micro-batch: the first stage's inputs plus the side inputs (labels,
// masks) with an id. Every rank reading (step, index) must get equal data.
struct MicroBatchData {
  Activations inputs;
  MicroBatch batch;
  // With kLossMaskKey in batch: the trained tokens of the step's whole global
  // batch (every micro-batch of every data-parallel replica), the same in
  // every micro-batch of the step; > 0. Without: 0.
  int64_t global_loss_tokens = 0;
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

// What a loss function returns from its per-token losses (shaped like the
// labels): their mean, or with kLossMaskKey the sum over the mask.
inline torch::Tensor ReduceTokenLosses(const torch::Tensor& token_losses, const MicroBatch& batch) {
  if (!batch.Has(kLossMaskKey)) return token_losses.mean();
  const torch::Tensor& mask = batch.Get(kLossMaskKey);
  TORCH_CHECK(mask.sizes() == token_losses.sizes(), "\"", kLossMaskKey, "\" ", mask.sizes(),
              " does not match the per-token losses ", token_losses.sizes());
  return (token_losses * mask.to(token_losses.scalar_type())).sum();
}

}  // namespace pp

#endif  // PIPELINE_RUNTIME_MICRO_BATCH_SOURCE_H_
