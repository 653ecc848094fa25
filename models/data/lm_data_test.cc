#include "models/data/lm_data.h"

#include <numeric>
#include <set>

#include <gtest/gtest.h>

namespace pp {
namespace {

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

LmBatchSource MakeSource(LmDataOptions options, int64_t n = 1000) {
  absl::StatusOr<LmBatchSource> source = LmBatchSource::Create(Iota(n), options);
  EXPECT_TRUE(source.ok()) << source.status();
  return *std::move(source);
}

TEST(LmBatchSourceTest, LabelsAreTheNextTokens) {
  LmBatchSource source = MakeSource({.seq_len = 16, .micro_batch_size = 3, .num_microbatches = 2});
  MicroBatch batch = source.Batch(5, 1);
  EXPECT_EQ(batch.id, 5 * 2 + 1);
  const torch::Tensor& ids = batch.Get("input_ids");
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{3, 16}));
  EXPECT_EQ(ids.dtype(), torch::kLong);
  // The corpus is 0, 1, 2, ...: windows are runs and labels are shifted by one.
  EXPECT_TRUE(torch::equal(batch.Get("labels"), ids + 1));
  EXPECT_TRUE(
      torch::equal(ids.select(1, 15) - ids.select(1, 0), torch::full({3}, 15, torch::kLong)));
}

TEST(LmBatchSourceTest, DeterministicAndStepsDiffer) {
  LmDataOptions options{.seq_len = 8, .micro_batch_size = 4, .num_microbatches = 2, .seed = 7};
  LmBatchSource a = MakeSource(options);
  LmBatchSource b = MakeSource(options);
  EXPECT_TRUE(torch::equal(a.Batch(3, 1).Get("input_ids"), b.Batch(3, 1).Get("input_ids")));
  EXPECT_FALSE(torch::equal(a.Batch(3, 1).Get("input_ids"), a.Batch(4, 1).Get("input_ids")));
  options.seed = 8;
  EXPECT_FALSE(torch::equal(a.Batch(3, 1).Get("input_ids"),
                            MakeSource(options).Batch(3, 1).Get("input_ids")));
}

TEST(LmBatchSourceTest, DataParallelShardsTileTheGlobalBatch) {
  // dp=2 x M=2 x b=2 must see exactly the rows dp=1 x M=4 x b=2 sees, in order.
  LmBatchSource whole = MakeSource({.seq_len = 8, .micro_batch_size = 2, .num_microbatches = 4});
  std::vector<torch::Tensor> expected, actual;
  for (int64_t m = 0; m < 4; ++m) expected.push_back(whole.Batch(9, m).Get("input_ids"));
  for (int64_t rank = 0; rank < 2; ++rank) {
    LmBatchSource shard = MakeSource({.seq_len = 8,
                                      .micro_batch_size = 2,
                                      .num_microbatches = 2,
                                      .dp_rank = rank,
                                      .dp_size = 2});
    for (const MicroBatch& mb : shard.Step(9)) actual.push_back(mb.Get("input_ids"));
  }
  EXPECT_TRUE(torch::equal(torch::cat(expected), torch::cat(actual)));
  // The two ranks see different windows.
  EXPECT_FALSE(torch::equal(actual[0], actual[2]));
}

TEST(LmBatchSourceTest, RuntimeSourceUsesGlobalIndicesWithUniqueIds) {
  LmBatchSource rank1 = MakeSource(
      {.seq_len = 8, .micro_batch_size = 2, .num_microbatches = 3, .dp_rank = 1, .dp_size = 2});
  absl::StatusOr<MicroBatchData> data = rank1.Get(4, 5);
  ASSERT_TRUE(data.ok()) << data.status();
  // Global index 5 = replica 1's micro-batch 2.
  EXPECT_TRUE(torch::equal(data->batch.Get("input_ids"), rank1.Batch(4, 2).Get("input_ids")));
  ASSERT_EQ(data->inputs.size(), 1u);
  EXPECT_TRUE(torch::equal(data->inputs[0], data->batch.Get("input_ids")));
  std::set<int64_t> ids;
  for (int64_t step = 0; step < 3; ++step) {
    for (int64_t index = 0; index < 6; ++index) ids.insert(rank1.Get(step, index)->batch.id);
  }
  EXPECT_EQ(ids.size(), 18u);
  EXPECT_EQ(rank1.Get(0, 6).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(LmBatchSourceTest, WindowsCoverTheCorpusUniformly) {
  LmBatchSource source =
      MakeSource({.seq_len = 10, .micro_batch_size = 1, .num_microbatches = 1}, 111);
  std::vector<int> hits(101, 0);
  for (int64_t step = 0; step < 20000; ++step) {
    const int64_t start = source.WindowStart(step, 0);
    ASSERT_GE(start, 0);
    ASSERT_LE(start, 100);  // the last window's label is the last token
    ++hits[start];
  }
  for (int h : hits) EXPECT_GT(h, 100);  // ~198 expected each
}

TEST(LmBatchSourceTest, RejectsBadOptionsNamingThem) {
  auto status = LmBatchSource::Create(Iota(5), {.seq_len = 8}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("seq_len 8"), std::string::npos) << status;
  status = LmBatchSource::Create(Iota(100), {.seq_len = 8, .dp_rank = 2, .dp_size = 2}).status();
  EXPECT_NE(status.message().find("dp_rank (2)"), std::string::npos) << status;
  status = LmBatchSource::Create(Iota(100), {.seq_len = 8, .micro_batch_size = 0}).status();
  EXPECT_NE(status.message().find("micro_batch_size (0)"), std::string::npos) << status;
}

}  // namespace
}  // namespace pp
