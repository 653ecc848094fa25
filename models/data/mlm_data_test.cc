#include "models/data/mlm_data.h"

#include <gtest/gtest.h>

#include "models/data/tokenizer.h"

namespace pp {
namespace {

std::string MakeText() {
  std::string text;
  const char* words[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"};
  for (int s = 0; s < 400; ++s) {
    for (int w = 0; w <= s % 7; ++w) text += std::string(words[(s * 3 + w) % 8]) + " ";
    text += (s % 10 == 9) ? "end.\n\n" : "stop. ";
  }
  return text;
}

TEST(SplitSentencesTest, SplitsOnPunctuationAndBlankLines) {
  EXPECT_EQ(SplitSentences("One two.  Three\nfour! Title\n \nNext v1.2 ok? "),
            (std::vector<std::string>{"One two.", "Three four!", "Title", "Next v1.2 ok?"}));
}

TEST(MlmBatchSourceTest, LayoutPaddingAndMasks) {
  absl::StatusOr<MlmBatchSource> source = MlmBatchSource::Create(
      MakeText(), {.seq_len = 64, .micro_batch_size = 8, .num_microbatches = 2});
  ASSERT_TRUE(source.ok()) << source.status();
  bool saw_padding = false, saw_pair = false;
  for (int64_t step = 0; step < 10; ++step) {
    MicroBatch batch = source->Batch(step, 1);
    const torch::Tensor ids = batch.Get("input_ids");
    const torch::Tensor types = batch.Get("token_type_ids");
    const torch::Tensor mask = batch.Get("attention_mask");
    const torch::Tensor labels = batch.Get("labels");
    ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{8, 64}));
    ASSERT_EQ(mask.dtype(), torch::kBool);
    for (int64_t i = 0; i < 8; ++i) {
      EXPECT_EQ(ids[i][0].item<int64_t>(), ByteTokenizer::kCls);
      const int64_t length = mask[i].sum().item<int64_t>();
      // The attention mask is a prefix of real tokens, the rest is [PAD].
      EXPECT_TRUE(mask[i].slice(0, 0, length).all().item<bool>());
      EXPECT_TRUE((ids[i].slice(0, length) == ByteTokenizer::kPad).all().item<bool>());
      EXPECT_EQ(ids[i][length - 1].item<int64_t>(), ByteTokenizer::kSep);
      EXPECT_TRUE((labels[i].slice(0, length) == kIgnoreLabel).all().item<bool>());
      saw_padding |= length < 64;
      saw_pair |= types[i].max().item<int64_t>() == 1;
      // At least one position predicted, never a special one.
      const torch::Tensor selected = labels[i] != kIgnoreLabel;
      EXPECT_GE(selected.sum().item<int64_t>(), 1);
      EXPECT_TRUE(
          (labels[i].masked_select(selected) < ByteTokenizer::kNumBytes).all().item<bool>());
    }
  }
  EXPECT_TRUE(saw_padding);
  EXPECT_TRUE(saw_pair);
}

TEST(MlmBatchSourceTest, MaskingRatesFollowBert) {
  absl::StatusOr<MlmBatchSource> source = MlmBatchSource::Create(
      MakeText(), {.seq_len = 128, .micro_batch_size = 16, .num_microbatches = 1});
  ASSERT_TRUE(source.ok()) << source.status();
  int64_t maskable = 0, selected = 0, masked = 0, unchanged = 0, random = 0;
  for (int64_t step = 0; step < 60; ++step) {
    MicroBatch batch = source->Batch(step, 0);
    const torch::Tensor ids = batch.Get("input_ids");
    const torch::Tensor labels = batch.Get("labels");
    const torch::Tensor is_selected = labels != kIgnoreLabel;
    // Unselected real tokens are bytes; selected ones were bytes before masking.
    const torch::Tensor real_bytes = (ids < ByteTokenizer::kNumBytes) & batch.Get("attention_mask");
    maskable +=
        (real_bytes & ~is_selected).sum().item<int64_t>() + is_selected.sum().item<int64_t>();
    selected += is_selected.sum().item<int64_t>();
    masked += (is_selected & (ids == ByteTokenizer::kMask)).sum().item<int64_t>();
    unchanged += (is_selected & (ids == labels)).sum().item<int64_t>();
    random +=
        (is_selected & (ids != labels) & (ids < ByteTokenizer::kNumBytes)).sum().item<int64_t>();
  }
  const double rate = static_cast<double>(selected) / maskable;
  EXPECT_NEAR(rate, 0.15, 0.015);
  EXPECT_NEAR(static_cast<double>(masked) / selected, 0.8, 0.03);
  // "Random" replacements that drew the original byte count as unchanged.
  EXPECT_NEAR(static_cast<double>(unchanged) / selected, 0.1, 0.03);
  EXPECT_NEAR(static_cast<double>(random) / selected, 0.1, 0.03);
}

TEST(MlmBatchSourceTest, ShardsTileTheGlobalBatchAndAreDeterministic) {
  const std::string text = MakeText();
  auto whole =
      MlmBatchSource::Create(text, {.seq_len = 32, .micro_batch_size = 2, .num_microbatches = 2});
  auto r1 = MlmBatchSource::Create(
      text,
      {.seq_len = 32, .micro_batch_size = 2, .num_microbatches = 1, .dp_rank = 1, .dp_size = 2});
  ASSERT_TRUE(whole.ok() && r1.ok());
  EXPECT_TRUE(torch::equal(whole->Batch(3, 1).Get("input_ids"), r1->Batch(3, 0).Get("input_ids")));
  EXPECT_TRUE(torch::equal(whole->Batch(3, 1).Get("labels"), r1->Batch(3, 0).Get("labels")));
  EXPECT_FALSE(
      torch::equal(whole->Batch(3, 0).Get("input_ids"), whole->Batch(4, 0).Get("input_ids")));
}

TEST(MlmBatchSourceTest, RejectsBadOptions) {
  EXPECT_EQ(MlmBatchSource::Create("Some text.", {.seq_len = 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(MlmBatchSource::Create("Some text.", {.mask_prob = 0})
                .status()
                .message()
                .find("mask_prob (0)"),
            std::string::npos);
  EXPECT_EQ(MlmBatchSource::Create("   \n\n  ", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pp
