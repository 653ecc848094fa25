#include "models/data/synthetic_lm_data.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/data/counter_rng.h"

namespace pp {

absl::StatusOr<SyntheticLmBatchSource> SyntheticLmBatchSource::Create(SyntheticLmOptions options) {
  const LmDataOptions& o = options.lm;
  if (o.seq_len <= 0 || o.micro_batch_size <= 0 || o.num_microbatches <= 0 || o.dp_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len (", o.seq_len, "), micro_batch_size (",
                                                   o.micro_batch_size, "), num_microbatches (",
                                                   o.num_microbatches, ") and dp_size (", o.dp_size,
                                                   ") must all be positive"));
  }
  if (o.dp_rank < 0 || o.dp_rank >= o.dp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp_rank (", o.dp_rank, ") must be in [0, ", o.dp_size, ")"));
  }
  if (options.vocab < 2 || options.max_stride < 1) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic vocab (", options.vocab,
                                                   ") must be >= 2 and max_stride (",
                                                   options.max_stride, ") >= 1"));
  }
  return SyntheticLmBatchSource(options);
}

MicroBatch SyntheticLmBatchSource::AtGlobalIndex(int64_t step, int64_t index) const {
  const int64_t b = options_.lm.micro_batch_size;
  const int64_t t = options_.lm.seq_len;
  const int64_t v = options_.vocab;
  torch::Tensor inputs = torch::empty({b, t}, torch::kLong);
  torch::Tensor labels = torch::empty({b, t}, torch::kLong);
  auto in = inputs.accessor<int64_t, 2>();
  auto out = labels.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b; ++i) {
    internal_data::CounterRng rng(options_.lm.seed, static_cast<uint64_t>(step),
                                  static_cast<uint64_t>(index * b + i));
    const auto start = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(v)));
    const auto stride =
        1 + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(options_.max_stride)));
    int64_t token = start;
    for (int64_t j = 0; j < t; ++j) {
      in[i][j] = token;
      token = (token + stride) % v;
      out[i][j] = token;
    }
  }
  MicroBatch batch;
  batch.id = step * options_.lm.dp_size * options_.lm.num_microbatches + index;
  batch.tensors["input_ids"] = inputs;
  batch.tensors["labels"] = labels;
  return batch;
}

}  // namespace pp
