#include "bench/peer_gpt.h"

#include <gtest/gtest.h>

#include "absl/flags/flag.h"

namespace pp {
namespace {

// The defaults are the peer GPT of ../shared/peers/README.md.
TEST(PeerGptTest, DefaultsAreThePeerGpt) {
  const GptModelConfig config = PeerGptModelConfig();
  EXPECT_EQ(config.vocab_size(), 256);
  EXPECT_EQ(config.width(), 256);
  EXPECT_EQ(config.num_layers(), 8);
  EXPECT_EQ(config.num_heads(), 4);
  EXPECT_EQ(config.context_length(), 128);
  EXPECT_EQ(config.mlp_ratio(), 4);
  EXPECT_EQ(config.dropout(), 0.0);
  const SyntheticLmOptions data = PeerGptData(8);
  EXPECT_EQ(data.lm.seq_len, 128);
  EXPECT_EQ(data.lm.micro_batch_size, 4);
  EXPECT_EQ(data.lm.num_microbatches, 8);
  EXPECT_EQ(data.lm.seed, kPeerGptSeed);
  EXPECT_EQ(kPeerGptSeed, 1234u);
}

TEST(PeerGptTest, SizeFlagsResizeModelAndData) {
  absl::SetFlag(&FLAGS_width, 32);
  absl::SetFlag(&FLAGS_layers, 2);
  absl::SetFlag(&FLAGS_heads, 2);
  absl::SetFlag(&FLAGS_context, 16);
  absl::SetFlag(&FLAGS_micro_batch_size, 3);
  const GptModelConfig config = PeerGptModelConfig();
  EXPECT_EQ(config.width(), 32);
  EXPECT_EQ(config.num_layers(), 2);
  EXPECT_EQ(config.num_heads(), 2);
  EXPECT_EQ(config.context_length(), 16);
  EXPECT_EQ(config.vocab_size(), 256);
  const SyntheticLmOptions data = PeerGptData(1);
  EXPECT_EQ(data.lm.seq_len, 16);
  EXPECT_EQ(data.lm.micro_batch_size, 3);
  EXPECT_EQ(data.lm.num_microbatches, 1);
  absl::SetFlag(&FLAGS_width, 256);
  absl::SetFlag(&FLAGS_layers, 8);
  absl::SetFlag(&FLAGS_heads, 4);
  absl::SetFlag(&FLAGS_context, 128);
  absl::SetFlag(&FLAGS_micro_batch_size, 4);
}

}  // namespace
}  // namespace pp
