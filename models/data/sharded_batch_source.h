// A MicroBatchSource whose micro-batches are a pure function of (step, global
// index), shared by the GPT and BERT data: every rank that asks for a
// micro-batch (first stage: inputs, last stage: labels) computes the same
// tensors itself, and data-parallel rank r owns global indices
// [r * num_microbatches, (r + 1) * num_microbatches) of a step.
#ifndef MODELS_DATA_SHARDED_BATCH_SOURCE_H_
#define MODELS_DATA_SHARDED_BATCH_SOURCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/layers/layer.h"
#include "pipeline/runtime/micro_batch_source.h"

namespace pp {

// Subclasses implement AtGlobalIndex; immutable after construction and
// thread-safe when AtGlobalIndex is.
class ShardedBatchSource : public MicroBatchSource {
 public:
  ShardedBatchSource(int64_t dp_rank, int64_t dp_size, int64_t num_microbatches)
      : dp_rank_(dp_rank), dp_size_(dp_size), num_microbatches_(num_microbatches) {}

  // Micro-batch `index` in [0, dp_size * num_microbatches) of the step's
  // global batch; id = step * dp_size * num_microbatches + index, unique per
  // (step, index). Inputs of the first layer are its "input_ids".
  virtual MicroBatch AtGlobalIndex(int64_t step, int64_t index) const = 0;

  // Per-token loss (micro_batch_source.h): a source whose micro-batches carry
  // a loss mask returns the trained tokens of `step`'s whole global batch;
  // 0 (the default) for sources without one.
  virtual int64_t GlobalLossTokens(int64_t step) const { return 0; }

  // This rank's micro-batch `microbatch` (in [0, num_microbatches)) of `step`:
  // global index dp_rank * num_microbatches + microbatch.
  MicroBatch Batch(int64_t step, int64_t microbatch) const {
    return AtGlobalIndex(step, dp_rank_ * num_microbatches_ + microbatch);
  }
  // All of this rank's micro-batches of `step`, in order.
  std::vector<MicroBatch> Step(int64_t step) const;

  // MicroBatchSource (the runtime's view; `index` is global as above, so
  // dp_rank is not used): inputs = {input_ids}, global_loss_tokens from
  // GlobalLossTokens when the batch has a loss mask; OutOfRange for a bad
  // index.
  absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) final;

 private:
  int64_t dp_rank_;
  int64_t dp_size_;
  int64_t num_microbatches_;
};

}  // namespace pp

#endif  // MODELS_DATA_SHARDED_BATCH_SOURCE_H_
