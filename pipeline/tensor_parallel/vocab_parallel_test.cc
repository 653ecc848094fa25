#include "pipeline/tensor_parallel/vocab_parallel.h"

#include <string>

#include "gtest/gtest.h"
#include "pipeline/tensor_parallel/mappings.h"
#include "pipeline/tensor_parallel/planted_fault.h"
#include "pipeline/tensor_parallel/tp_testing.h"

namespace pp {
namespace tensor_parallel {
namespace {

// Embedding -> tied logits -> cross-entropy with the vocabulary split over 2
// thread ranks, against torch::embedding, x @ table^T and
// torch::nn::functional::cross_entropy. The vocabulary (11) does not divide
// by 2, so it is padded to 12: the last row of rank 1 is padding. One target
// is the ignore index.
constexpr int64_t kVocab = 11, kDim = 4, kBatch = 3, kSeq = 4;

class VocabParallelTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(VocabParallelTest, LossAndGradientsEqualTheDenseModel) {
  const TpCase c = GetParam();
  const torch::Tensor table = Seeded(1, [] { return torch::randn({kVocab, kDim}); });
  const torch::Tensor ids = Seeded(2, [] { return torch::randint(kVocab, {kBatch, kSeq}); });
  torch::Tensor targets = Seeded(3, [] { return torch::randint(kVocab, {kBatch, kSeq}); });
  targets[1][2] = -100;
  targets[0][0] = kVocab - 1;  // the last real row, beside the padding

  torch::Tensor dense_table = table.to(c.dtype).clone().requires_grad_(true);
  torch::Tensor hidden = torch::embedding(dense_table, ids);
  torch::Tensor logits = torch::matmul(torch::tanh(hidden), dense_table.t());
  torch::Tensor dense_loss = torch::nn::functional::cross_entropy(
      logits.reshape({-1, kVocab}).to(torch::kFloat32), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
  dense_loss.backward();

  ExpectOk(RunOnTensorParallelRanks(2, c.sequence_parallel, [&](const ModelParallelGroup& g) {
    VocabParallelEmbedding embed(table, g);
    embed->to(c.dtype);
    EXPECT_EQ(embed->weight.size(0), 6);
    torch::Tensor h = embed(ids);
    torch::Tensor shard_logits = VocabParallelLogits(torch::tanh(h), embed->weight, g);
    ASSERT_EQ(shard_logits.sizes(), (std::vector<int64_t>{kBatch, kSeq, 6}));
    torch::Tensor per_token = VocabParallelCrossEntropy(shard_logits, targets, kVocab, g);
    torch::Tensor loss = per_token.sum() / (targets != -100).sum();
    loss.backward();
    EXPECT_LE(RelativeDiff(loss, dense_loss), c.tolerance) << "loss";
    torch::Tensor want_rows = torch::zeros({6, kDim}, dense_table.grad().options());
    const int64_t real = g.rank == 0 ? 6 : 5;
    want_rows.narrow(0, 0, real).copy_(dense_table.grad().narrow(0, g.rank * 6, real));
    EXPECT_LE(RelativeDiff(embed->weight.grad(), want_rows), c.tolerance)
        << "table gradient (tied: embedding + logits)";
    if (g.rank == 1) {
      EXPECT_EQ(embed->weight.grad()[5].abs().max().item<double>(), 0.0)
          << "the padding row gets no gradient";
    }
  }));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, VocabParallelTest,
    ::testing::Values(TpCase{false, torch::kFloat32, 1e-6, "fp32"},
                      TpCase{true, torch::kFloat32, 1e-6, "fp32_sequence_parallel"},
                      TpCase{false, torch::kBFloat16, 3e-2, "bf16"}),
    [](const ::testing::TestParamInfo<TpCase>& info) { return info.param.name; });

TEST(VocabParallelCrossEntropyTest, ATargetOutsideTheVocabularyIsNamed) {
  ModelParallelGroup dense;
  const torch::Tensor logits = torch::zeros({2, 5});
  try {
    VocabParallelCrossEntropy(logits, torch::tensor({1, 7}), 5, dense);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("target id 7 is outside [0, 5)"), std::string::npos)
        << e.what();
  }
}

TEST(VocabParallelCrossEntropyTest, PaddingAndRanges) {
  EXPECT_EQ(PaddedVocabSize(11, 2), 12);
  EXPECT_EQ(PaddedVocabSize(12, 4), 12);
  ModelParallelGroup g;
  g.size = 4;
  g.rank = 3;
  EXPECT_EQ(LocalVocabRange(13, g).begin, 12);
  EXPECT_EQ(LocalVocabRange(13, g).end, 16);
  // Rank 3 of 4 holds one real row and three padding rows.
  const torch::Tensor rows = LocalVocabRows(torch::ones({13, 2}), g);
  EXPECT_EQ(rows.sum().item<double>(), 2.0);
}

// A missing max all-reduce or a wrong slice of the vocabulary changes the loss.
TEST(VocabParallelCrossEntropyTest, PlantedFaultsAreVisible) {
  const torch::Tensor logits = Seeded(4, [] { return torch::randn({5, 8}) * 3; });
  const torch::Tensor targets = torch::tensor({0, 3, 4, 7, 2});
  const double want = torch::nn::functional::cross_entropy(logits, targets).item<double>();
  ExpectOk(RunOnTensorParallelRanks(2, false, [&](const ModelParallelGroup& g) {
    const torch::Tensor mine = logits.narrow(1, 4 * g.rank, 4);
    auto loss = [&] {
      return VocabParallelCrossEntropy(mine, targets, 8, g).mean().item<double>();
    };
    EXPECT_NEAR(loss(), want, 1e-6);
    (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
    if (g.rank == 0) internal::PlantFault(internal::PlantedFault::kSkipAllReduce);
    (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
    EXPECT_GT(std::abs(loss() - want), 1e-3);
    (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
    if (g.rank == 0) internal::PlantFault(internal::PlantedFault::kNone);
  }));
}

}  // namespace
}  // namespace tensor_parallel
}  // namespace pp
