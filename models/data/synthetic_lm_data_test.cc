#include "models/data/synthetic_lm_data.h"

#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pp {
namespace {

SyntheticLmOptions Options(int64_t dp_rank, int64_t dp_size, int64_t m, int64_t b) {
  SyntheticLmOptions o;
  o.lm = LmDataOptions{.seq_len = 16,
                       .micro_batch_size = b,
                       .num_microbatches = m,
                       .dp_rank = dp_rank,
                       .dp_size = dp_size,
                       .seed = 7};
  return o;
}

TEST(SyntheticLmDataTest, RowsAreProgressionsAndLabelsAreTheNextToken) {
  auto source = SyntheticLmBatchSource::Create(Options(0, 1, 4, 3));
  ASSERT_TRUE(source.ok()) << source.status();
  std::set<int64_t> strides;
  for (int64_t mb = 0; mb < 4; ++mb) {
    MicroBatch batch = source->Batch(5, mb);
    const torch::Tensor in = batch.tensors.at("input_ids");
    const torch::Tensor labels = batch.tensors.at("labels");
    ASSERT_EQ(in.sizes(), (std::vector<int64_t>{3, 16}));
    EXPECT_EQ(batch.id, 5 * 4 + mb);
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t stride = (labels[i][0].item<int64_t>() - in[i][0].item<int64_t>() + 256) % 256;
      EXPECT_GE(stride, 1);
      EXPECT_LE(stride, 7);
      strides.insert(stride);
      for (int64_t j = 0; j < 16; ++j) {
        const int64_t x = in[i][j].item<int64_t>();
        EXPECT_GE(x, 0);
        EXPECT_LT(x, 256);
        EXPECT_EQ(labels[i][j].item<int64_t>(), (x + stride) % 256);
        if (j + 1 < 16) {
          EXPECT_EQ(in[i][j + 1].item<int64_t>(), labels[i][j].item<int64_t>());
        }
      }
    }
  }
  EXPECT_GT(strides.size(), 2u);  // drawn, not constant
}

TEST(SyntheticLmDataTest, GlobalBatchDoesNotDependOnTheSplit) {
  // One replica with 4 micro-batches of 2 rows == 2 replicas with 2 of 2 ==
  // 1 replica with 2 micro-batches of 4 rows, row for row.
  auto one = SyntheticLmBatchSource::Create(Options(0, 1, 4, 2));
  auto big = SyntheticLmBatchSource::Create(Options(0, 1, 2, 4));
  ASSERT_TRUE(one.ok() && big.ok());
  std::vector<torch::Tensor> a, c;
  for (int64_t mb = 0; mb < 4; ++mb) a.push_back(one->Batch(3, mb).tensors.at("input_ids"));
  for (int64_t r = 0; r < 2; ++r) {
    auto rank = SyntheticLmBatchSource::Create(Options(r, 2, 2, 2));
    ASSERT_TRUE(rank.ok());
    for (int64_t mb = 0; mb < 2; ++mb) c.push_back(rank->Batch(3, mb).tensors.at("input_ids"));
  }
  std::vector<torch::Tensor> b;
  for (int64_t mb = 0; mb < 2; ++mb) b.push_back(big->Batch(3, mb).tensors.at("input_ids"));
  EXPECT_TRUE(torch::equal(torch::cat(a), torch::cat(b)));
  EXPECT_TRUE(torch::equal(torch::cat(a), torch::cat(c)));
  // Another step or seed gives other data.
  EXPECT_FALSE(torch::equal(one->Batch(3, 0).tensors.at("input_ids"),
                            one->Batch(4, 0).tensors.at("input_ids")));
}

TEST(SyntheticLmDataTest, BadOptionsAreNamed) {
  SyntheticLmOptions o = Options(0, 1, 4, 2);
  o.vocab = 1;
  auto s = SyntheticLmBatchSource::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("vocab (1)"));
  s = SyntheticLmBatchSource::Create(Options(2, 2, 4, 2));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("dp_rank (2)"));
}

}  // namespace
}  // namespace pp
