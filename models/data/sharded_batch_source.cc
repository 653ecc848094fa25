#include "models/data/sharded_batch_source.h"

#include "absl/strings/str_cat.h"

namespace pp {

std::vector<MicroBatch> ShardedBatchSource::Step(int64_t step) const {
  std::vector<MicroBatch> batches;
  for (int64_t m = 0; m < num_microbatches_; ++m) batches.push_back(Batch(step, m));
  return batches;
}

absl::StatusOr<MicroBatchData> ShardedBatchSource::Get(int64_t step, int64_t index) {
  const int64_t global_size = dp_size_ * num_microbatches_;
  if (index < 0 || index >= global_size || step < 0) {
    return absl::OutOfRangeError(absl::StrCat("micro-batch ", index, " of step ", step,
                                              " requested; a step has ", global_size,
                                              " (dp_size x num_microbatches)"));
  }
  MicroBatchData data;
  data.batch = AtGlobalIndex(step, index);
  data.inputs = {data.batch.Get("input_ids")};
  if (data.batch.Has(kLossMaskKey)) data.global_loss_tokens = GlobalLossTokens(step);
  return data;
}

}  // namespace pp
