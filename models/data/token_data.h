// Language-model micro-batches from a pre-tokenized corpus (token_file.h):
// windows of seq_len + 1 tokens, "input_ids" the first seq_len, "labels" the
// last seq_len, as LmBatchSource makes them from a text.
//
// The same contract as every ShardedBatchSource: a step's global batch is
// dp_size * num_microbatches * micro_batch_size windows whose starts are drawn
// from (seed, step, global row) alone, so batches do not depend on how they
// are split over ranks and micro-batches, and a run resumed at step k (a new
// source over the same files) sees exactly the batches the interrupted run
// would have seen. There is no epoch state to save.
//
// Split: the last eval_fraction of the tokens (rounded down to whole tokens)
// form the eval split, the rest the train split; windows never cross the cut.
// Document-aware sampling: windows never cross a document boundary (documents
// shorter than seq_len + 1 are never drawn); every window that fits is equally
// likely. Otherwise windows run across documents, as nanoGPT samples.
//
// Loss masks (fine-tuning data, tools/data/tokens.py finetune): a file
// LossMaskPath(options) beside the tokens, one byte per token, 1 where the
// token is a trained label (a response), 0 where not (a prompt). When it is
// there, micro-batches carry "loss_mask" and the loss is per token over the
// global batch (pipeline/runtime/micro_batch_source.h).
#ifndef MODELS_DATA_TOKEN_DATA_H_
#define MODELS_DATA_TOKEN_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/data/sharded_batch_source.h"
#include "models/data/token_file.h"

namespace pp {

enum class TokenSplit { kTrain, kEval };

struct TokenDataOptions {
  std::string path;  // flat: the file; megatron: the prefix (or .bin / .idx)
  TokenFormat format = TokenFormat::kFlat;
  int flat_bytes_per_token = 2;  // flat only: 2 (uint16) or 4 (uint32)
  int64_t vocab_size = 0;        // the model's; every token id must be below it
  int64_t seq_len = 128;
  int64_t micro_batch_size = 4;
  int64_t num_microbatches = 4;
  int64_t dp_rank = 0;
  int64_t dp_size = 1;
  uint64_t seed = 1234;
  double eval_fraction = 0.0;  // in [0, 1)
  TokenSplit split = TokenSplit::kTrain;
  bool document_aware = false;
};

// Immutable after construction; thread-safe.
class TokenBatchSource : public ShardedBatchSource {
 public:
  // Opens the files and checks everything a run needs before any worker
  // starts: the layout (token_file.h), every token below vocab_size (the error
  // names the file and offset), positive sizes, dp_rank in range, eval_fraction
  // in [0, 1), and at least one window in the chosen split.
  static absl::StatusOr<TokenBatchSource> Create(const TokenDataOptions& options);

  MicroBatch AtGlobalIndex(int64_t step, int64_t index) const override;

  // The token offset of global row `row` of `step`'s window (for tests).
  int64_t WindowStart(int64_t step, int64_t row) const;
  // Windows the split offers.
  int64_t num_windows() const { return window_prefix_.back(); }
  // With a loss mask: the trained labels of `step`'s whole global batch.
  int64_t GlobalLossTokens(int64_t step) const override;
  bool has_loss_mask() const { return loss_mask_ != nullptr; }
  const TokenFile& file() const { return *file_; }
  const TokenDataOptions& options() const { return options_; }

 private:
  TokenBatchSource(TokenDataOptions options, std::shared_ptr<const TokenFile> file,
                   std::vector<int64_t> segment_starts, std::vector<int64_t> window_prefix,
                   std::shared_ptr<const std::vector<uint8_t>> loss_mask)
      : ShardedBatchSource(options.dp_rank, options.dp_size, options.num_microbatches),
        options_(std::move(options)),
        file_(std::move(file)),
        segment_starts_(std::move(segment_starts)),
        window_prefix_(std::move(window_prefix)),
        loss_mask_(std::move(loss_mask)) {}

  TokenDataOptions options_;
  std::shared_ptr<const TokenFile> file_;
  // Segments windows are drawn from (the split, cut at documents when
  // document-aware): segment i starts at token segment_starts_[i] and offers
  // window_prefix_[i + 1] - window_prefix_[i] windows.
  std::vector<int64_t> segment_starts_;
  std::vector<int64_t> window_prefix_;
  std::shared_ptr<const std::vector<uint8_t>> loss_mask_;  // null: every label trained
};

// Where a token file's loss mask lives: flat PATH -> PATH.loss_mask,
// Megatron PREFIX(.bin|.idx) -> PREFIX.loss_mask.
std::string LossMaskPath(const TokenDataOptions& options);

// The mask of `file` (one byte per token, each 0 or 1), or null when there
// is no mask file. InvalidArgument naming the file for a size other than
// the file's tokens or a byte other than 0 and 1.
absl::StatusOr<std::shared_ptr<const std::vector<uint8_t>>> LoadLossMask(
    const TokenDataOptions& options, const TokenFile& file);

// Create's checks without keeping the source: what a driver calls before launch.
absl::Status ValidateTokenData(const TokenDataOptions& options);

}  // namespace pp

#endif  // MODELS_DATA_TOKEN_DATA_H_
