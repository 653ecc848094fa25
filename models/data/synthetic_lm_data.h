// Synthetic language-model micro-batches of the kind DeepSpeed's peer
// benchmark trains on (../shared/peers/README.md): every row is an arithmetic
// progression of tokens modulo `vocab`, with a start in [0, vocab) and a
// stride in [1, max_stride] drawn from (seed, step, row). Learnable (the next
// token follows from the previous two), needs no corpus, and costs the same
// per token as real text, so it isolates the engine in a benchmark.
//
// Same layout as LmBatchSource (lm_data.h): global row = index * b + i, and
// micro-batch tensors "input_ids" / "labels" [b, T] int64, so pipeline and
// sequential runs with any pp x dp see the same global batch.
#ifndef MODELS_DATA_SYNTHETIC_LM_DATA_H_
#define MODELS_DATA_SYNTHETIC_LM_DATA_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "models/data/lm_data.h"
#include "models/data/sharded_batch_source.h"
#include "pipeline/layers/layer.h"

namespace pp {

struct SyntheticLmOptions {
  LmDataOptions lm;        // sizes, data-parallel slot and seed
  int64_t vocab = 256;     // tokens are in [0, vocab)
  int64_t max_stride = 7;  // strides are in [1, max_stride]
};

// Immutable after construction; thread-safe.
class SyntheticLmBatchSource : public ShardedBatchSource {
 public:
  // InvalidArgument naming the value when a size, vocab or max_stride is not
  // positive, or dp_rank is outside [0, dp_size).
  static absl::StatusOr<SyntheticLmBatchSource> Create(SyntheticLmOptions options);

  MicroBatch AtGlobalIndex(int64_t step, int64_t index) const override;

  int64_t global_tokens_per_step() const {
    return options_.lm.dp_size * options_.lm.num_microbatches * options_.lm.micro_batch_size *
           options_.lm.seq_len;
  }

 private:
  explicit SyntheticLmBatchSource(SyntheticLmOptions options)
      : ShardedBatchSource(options.lm.dp_rank, options.lm.dp_size, options.lm.num_microbatches),
        options_(options) {}

  SyntheticLmOptions options_;
};

}  // namespace pp

#endif  // MODELS_DATA_SYNTHETIC_LM_DATA_H_
