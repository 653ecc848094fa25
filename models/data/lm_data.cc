#include "models/data/lm_data.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/data/counter_rng.h"

namespace pp {

absl::StatusOr<LmBatchSource> LmBatchSource::Create(std::vector<int64_t> tokens,
                                                    LmDataOptions options) {
  if (options.seq_len <= 0 || options.micro_batch_size <= 0 || options.num_microbatches <= 0 ||
      options.dp_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len (", options.seq_len, "), micro_batch_size (",
                     options.micro_batch_size, "), num_microbatches (", options.num_microbatches,
                     ") and dp_size (", options.dp_size, ") must all be positive"));
  }
  if (options.dp_rank < 0 || options.dp_rank >= options.dp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp_rank (", options.dp_rank, ") must be in [0, ", options.dp_size, ")"));
  }
  if (static_cast<int64_t>(tokens.size()) < options.seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the corpus has ", tokens.size(), " tokens; windows of seq_len ", options.seq_len,
        " need at least ", options.seq_len + 1, " (use more text or a shorter context)"));
  }
  return LmBatchSource(std::move(tokens), options);
}

int64_t LmBatchSource::WindowStart(int64_t step, int64_t row) const {
  internal_data::CounterRng rng(options_.seed, static_cast<uint64_t>(step),
                                static_cast<uint64_t>(row));
  const auto num_starts = static_cast<uint64_t>(tokens_.size() - options_.seq_len);
  return static_cast<int64_t>(rng.Below(num_starts));
}

MicroBatch LmBatchSource::AtGlobalIndex(int64_t step, int64_t index) const {
  const int64_t b = options_.micro_batch_size;
  const int64_t t = options_.seq_len;
  torch::Tensor inputs = torch::empty({b, t}, torch::kLong);
  torch::Tensor labels = torch::empty({b, t}, torch::kLong);
  auto in = inputs.accessor<int64_t, 2>();
  auto out = labels.accessor<int64_t, 2>();
  const int64_t first_row = index * b;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t start = WindowStart(step, first_row + i);
    for (int64_t j = 0; j < t; ++j) {
      in[i][j] = tokens_[start + j];
      out[i][j] = tokens_[start + j + 1];
    }
  }
  MicroBatch batch;
  batch.id = step * options_.dp_size * options_.num_microbatches + index;
  batch.tensors["input_ids"] = inputs;
  batch.tensors["labels"] = labels;
  return batch;
}

}  // namespace pp
