// Language-model (GPT) micro-batches: fixed-length windows of a token stream.
//
// A step's global batch is dp_size * num_microbatches * micro_batch_size
// windows whose start positions are drawn from (seed, step, row); data-parallel
// rank r takes rows [r * M * b, (r + 1) * M * b) and micro-batch j of it takes
// the next b rows. The global batch therefore depends only on the global batch
// size, not on how it is split over ranks and micro-batches, which is what lets
// pipeline training with any pp x dp be compared with the sequential model.
//
// Micro-batch tensors: "input_ids" [b, T] int64 and "labels" [b, T] int64 (the
// next token of each input position).
#ifndef MODELS_DATA_LM_DATA_H_
#define MODELS_DATA_LM_DATA_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "models/data/sharded_batch_source.h"
#include "pipeline/layers/layer.h"

namespace pp {

struct LmDataOptions {
  int64_t seq_len = 128;
  int64_t micro_batch_size = 4;
  int64_t num_microbatches = 4;
  int64_t dp_rank = 0;
  int64_t dp_size = 1;
  uint64_t seed = 1234;
};

// Immutable after construction; thread-safe.
class LmBatchSource : public ShardedBatchSource {
 public:
  // InvalidArgument when a size is not positive, dp_rank is outside
  // [0, dp_size), or `tokens` is shorter than seq_len + 1.
  static absl::StatusOr<LmBatchSource> Create(std::vector<int64_t> tokens, LmDataOptions options);

  // Micro-batch `index` of the step's global batch (see ShardedBatchSource).
  MicroBatch AtGlobalIndex(int64_t step, int64_t index) const override;

  const LmDataOptions& options() const { return options_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  // Tokens predicted per step over all data-parallel ranks.
  int64_t global_tokens_per_step() const {
    return options_.dp_size * options_.num_microbatches * options_.micro_batch_size *
           options_.seq_len;
  }
  // The start position of global row `row` of `step` (exposed for tests).
  int64_t WindowStart(int64_t step, int64_t row) const;

 private:
  LmBatchSource(std::vector<int64_t> tokens, LmDataOptions options)
      : ShardedBatchSource(options.dp_rank, options.dp_size, options.num_microbatches),
        tokens_(std::move(tokens)),
        options_(options) {}

  std::vector<int64_t> tokens_;
  LmDataOptions options_;
};

}  // namespace pp

#endif  // MODELS_DATA_LM_DATA_H_
