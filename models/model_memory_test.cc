#include "models/model_memory.h"

#include "gtest/gtest.h"

namespace pp {
namespace {

const TransformerSizes kSmallGpt{
    .context_length = 64, .width = 128, .num_heads = 4, .num_layers = 4, .mlp_ratio = 4};

TEST(TransformerMemoryTest, BlockParametersSplitTheMatricesAndKeepNormsWhole) {
  const ModelMemory m = TransformerMemory(kSmallGpt);
  // 12 w^2 + 7 w split, 6 w whole.
  EXPECT_DOUBLE_EQ(m.block_parameters(1), 12 * 128 * 128 + 7 * 128 + 6 * 128);
  EXPECT_DOUBLE_EQ(m.block_parameters(1), 198272);
  EXPECT_DOUBLE_EQ(m.block_parameters(2), (12 * 128 * 128 + 7 * 128) / 2.0 + 6 * 128);
  EXPECT_EQ(m.num_blocks, 4);
  EXPECT_EQ(m.context_length, 64);
  EXPECT_DOUBLE_EQ(m.recompute_widths, 4);
}

TEST(TransformerMemoryTest, BlockActivationsSplitUnderTensorAndSequenceParallelism) {
  const ModelMemory m = TransformerMemory(kSmallGpt);
  // 15 widths of 4 bytes and two heads' probabilities per token, b = 8.
  EXPECT_DOUBLE_EQ(m.block_activation_bytes({.micro_batch_size = 8}),
                   8 * 64 * (15 * 128 * 4 + 2 * 4 * 64 * 4));
  // bf16 values; the probabilities stay fp32.
  EXPECT_DOUBLE_EQ(m.block_activation_bytes({.micro_batch_size = 8, .value_bytes = 2}),
                   8 * 64 * (15 * 128 * 2 + 2 * 4 * 64 * 4));
  // tp 2: 4 widths whole, 11 and the heads halved; with SP 2 whole.
  EXPECT_DOUBLE_EQ(m.block_activation_bytes({.micro_batch_size = 8, .tp = 2}),
                   8 * 64 * ((4 + 11 / 2.0) * 128 * 4 + 2 * 4 * 64 * 4 / 2.0));
  EXPECT_DOUBLE_EQ(
      m.block_activation_bytes({.micro_batch_size = 8, .tp = 2, .sequence_parallel = true}),
      8 * 64 * ((2 + 13 / 2.0) * 128 * 4 + 2 * 4 * 64 * 4 / 2.0));
}

}  // namespace
}  // namespace pp
