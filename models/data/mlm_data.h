// Masked-language-model (BERT) micro-batches from sentences of a text.
//
// The text is split into sentences (ending at . ! ? before white space, or at
// a blank line; white space collapsed). A sample packs consecutive sentences
// from a random start up to a random length, splits them into segments A and
// B at a sentence boundary and encodes "[CLS] A [SEP] B [SEP]" padded with
// [PAD] to seq_len, so lengths vary and padding is real. Masking follows BERT:
// each real, non-special token is selected with probability mask_prob (at least
// one per sample); a selected token becomes [MASK] with probability 0.8, a
// random byte with 0.1 and stays unchanged with 0.1.
//
// Micro-batch tensors, all [b, T]: "input_ids" int64, "token_type_ids" int64
// (0 for CLS/A/first SEP, 1 for B and its SEP, 0 for padding),
// "attention_mask" bool (true on real tokens), "labels" int64 (the original id
// on selected positions, kIgnoreLabel elsewhere).
//
// Sampling is counter-based on (seed, step, global row), sharded over
// data-parallel ranks exactly as in lm_data.h.
#ifndef MODELS_DATA_MLM_DATA_H_
#define MODELS_DATA_MLM_DATA_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "models/data/sharded_batch_source.h"
#include "pipeline/layers/layer.h"

namespace pp {

inline constexpr int64_t kIgnoreLabel = -100;

struct MlmDataOptions {
  int64_t seq_len = 128;
  int64_t micro_batch_size = 4;
  int64_t num_microbatches = 4;
  int64_t dp_rank = 0;
  int64_t dp_size = 1;
  uint64_t seed = 1234;
  double mask_prob = 0.15;
};

// Splits text into trimmed sentences with white space collapsed; empty ones
// are dropped.
std::vector<std::string> SplitSentences(std::string_view text);

// Immutable after construction; thread-safe.
class MlmBatchSource : public ShardedBatchSource {
 public:
  // InvalidArgument for non-positive sizes, dp_rank outside [0, dp_size),
  // seq_len < 8, mask_prob outside (0, 1], or a text without sentences.
  static absl::StatusOr<MlmBatchSource> Create(std::string_view text, MlmDataOptions options);

  // Micro-batch `index` of the step's global batch (see ShardedBatchSource).
  MicroBatch AtGlobalIndex(int64_t step, int64_t index) const override;

  const MlmDataOptions& options() const { return options_; }
  int64_t num_sentences() const { return static_cast<int64_t>(sentences_.size()); }

 private:
  MlmBatchSource(std::vector<std::string> sentences, MlmDataOptions options)
      : ShardedBatchSource(options.dp_rank, options.dp_size, options.num_microbatches),
        sentences_(std::move(sentences)),
        options_(options) {}
  // Writes one sample (global row `row` of `step`) into row `i` of the tensors.
  void FillRow(int64_t step, int64_t row, int64_t i, MicroBatch& batch) const;

  std::vector<std::string> sentences_;
  MlmDataOptions options_;
};

}  // namespace pp

#endif  // MODELS_DATA_MLM_DATA_H_
