#include "pipeline/tensor_parallel/linear.h"

#include <string>

#include "gtest/gtest.h"
#include "pipeline/tensor_parallel/mappings.h"
#include "pipeline/tensor_parallel/planted_fault.h"
#include "pipeline/tensor_parallel/sharded_module.h"
#include "pipeline/tensor_parallel/tp_testing.h"

namespace pp {
namespace tensor_parallel {
namespace {

// A transformer MLP (column-parallel 6 -> 10, GELU, row-parallel 10 -> 6) at
// tp = 2 against the same two dense torch::nn::Linear layers, on an uneven
// batch (3 rows, sequence 4, odd feature counts per rank: 5 hidden columns
// each), with and without sequence parallelism, in fp32 and bf16.
constexpr int64_t kIn = 6, kHidden = 10, kBatch = 3, kSeq = 4;

class ParallelMlpTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(ParallelMlpTest, OutputsAndGradientsEqualTheDenseLayers) {
  const TpCase c = GetParam();
  const torch::Tensor input = Seeded(7, [] { return torch::randn({kBatch, kSeq, kIn}); });
  const torch::Tensor upstream = Seeded(8, [] { return torch::randn({kBatch, kSeq, kIn}); });

  // The dense reference, drawn from the seeds the parallel layers use.
  torch::nn::Linear fc1 = Seeded(1, [] { return torch::nn::Linear(kIn, kHidden); });
  torch::nn::Linear fc2 = Seeded(2, [] { return torch::nn::Linear(kHidden, kIn); });
  fc1->to(c.dtype);
  fc2->to(c.dtype);
  torch::Tensor x = input.to(c.dtype).clone().requires_grad_(true);
  torch::Tensor y = fc2(torch::gelu(fc1(x)));
  (y * upstream.to(c.dtype)).sum().backward();

  ExpectOk(RunOnTensorParallelRanks(2, c.sequence_parallel, [&](const ModelParallelGroup& g) {
    ColumnParallelLinear col =
        Seeded(1, [&] { return ColumnParallelLinear(ParallelLinearOptions(kIn, kHidden), g); });
    RowParallelLinear row =
        Seeded(2, [&] { return RowParallelLinear(ParallelLinearOptions(kHidden, kIn), g); });
    col->to(c.dtype);
    row->to(c.dtype);
    const int64_t seq_part = kSeq / 2;
    torch::Tensor my_input =
        c.sequence_parallel ? input.narrow(1, g.rank * seq_part, seq_part) : input;
    torch::Tensor my_upstream =
        c.sequence_parallel ? upstream.narrow(1, g.rank * seq_part, seq_part) : upstream;
    torch::Tensor px = my_input.to(c.dtype).clone().requires_grad_(true);
    torch::Tensor py = row(torch::gelu(col(px)));
    (py * my_upstream.to(c.dtype)).sum().backward();

    const torch::Tensor want_y = c.sequence_parallel ? y.narrow(1, g.rank * seq_part, seq_part) : y;
    const torch::Tensor want_dx =
        c.sequence_parallel ? x.grad().narrow(1, g.rank * seq_part, seq_part) : x.grad();
    const int64_t h = kHidden / 2;
    EXPECT_LE(RelativeDiff(py, want_y), c.tolerance) << "output";
    EXPECT_LE(RelativeDiff(px.grad(), want_dx), c.tolerance) << "input gradient";
    EXPECT_LE(RelativeDiff(col->weight, fc1->weight.narrow(0, g.rank * h, h)), 0) << "fc1 shard";
    EXPECT_LE(RelativeDiff(col->weight.grad(), fc1->weight.grad().narrow(0, g.rank * h, h)),
              c.tolerance)
        << "fc1 weight gradient";
    EXPECT_LE(RelativeDiff(col->bias.grad(), fc1->bias.grad().narrow(0, g.rank * h, h)),
              c.tolerance)
        << "fc1 bias gradient";
    EXPECT_LE(RelativeDiff(row->weight.grad(), fc2->weight.grad().narrow(1, g.rank * h, h)),
              c.tolerance)
        << "fc2 weight gradient";
    // Replicated: the whole gradient on every rank (summed over the
    // sequence shards under sequence parallelism).
    EXPECT_LE(RelativeDiff(row->bias.grad(), fc2->bias.grad()), c.tolerance) << "fc2 bias gradient";
  }));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ParallelMlpTest,
    ::testing::Values(TpCase{false, torch::kFloat32, 1e-6, "fp32"},
                      TpCase{true, torch::kFloat32, 1e-6, "fp32_sequence_parallel"},
                      // bf16 keeps 8 bits: the partial sums each rank rounds
                      // before the all-reduce differ from the dense sum by a
                      // few units in the last place.
                      TpCase{false, torch::kBFloat16, 3e-2, "bf16"},
                      TpCase{true, torch::kBFloat16, 3e-2, "bf16_sequence_parallel"}),
    [](const ::testing::TestParamInfo<TpCase>& info) { return info.param.name; });

TEST(ParallelLinearTest, DenseGroupIsExactlyTorchLinear) {
  ModelParallelGroup dense;
  torch::nn::Linear a = Seeded(3, [] { return torch::nn::Linear(5, 7); });
  ColumnParallelLinear col =
      Seeded(3, [&] { return ColumnParallelLinear(ParallelLinearOptions(5, 7), dense); });
  RowParallelLinear row =
      Seeded(3, [&] { return RowParallelLinear(ParallelLinearOptions(5, 7), dense); });
  const torch::Tensor x = torch::randn({2, 3, 5});
  EXPECT_TRUE(torch::equal(col(x), a(x)));
  EXPECT_TRUE(torch::equal(row(x), a(x)));
  EXPECT_TRUE(col->ShardDims().empty());
}

TEST(ParallelLinearTest, ShardDimsNameTheSplitParametersOnly) {
  ExpectOk(RunOnTensorParallelRanks(2, false, [](const ModelParallelGroup& g) {
    torch::nn::Sequential mlp(
        Seeded(1, [&] { return ColumnParallelLinear(ParallelLinearOptions(4, 6), g); }),
        Seeded(2, [&] { return RowParallelLinear(ParallelLinearOptions(6, 4), g); }));
    EXPECT_EQ(CollectShardDims(*mlp),
              (std::map<std::string, ShardSpec>{
                  {"0.weight", {0, 1}}, {"0.bias", {0, 1}}, {"1.weight", {1, 1}}}));
  }));
}

TEST(ParallelLinearTest, FeaturesThatDoNotDivideAreRefused) {
  const absl::Status status = RunOnTensorParallelRanks(2, false, [](const ModelParallelGroup& g) {
    ColumnParallelLinear(ParallelLinearOptions(4, 7), g);
  });
  EXPECT_NE(
      status.message().find("out_features (7) must be a multiple of the tensor-parallel size 2"),
      std::string::npos)
      << status;
}

// A fused q/k/v projection of 2 heads: rank r holds head r's rows of each of
// q, k and v; merging the shards gives the dense weight back.
TEST(ParallelLinearTest, BlockedColumnsHoldEachRanksSliceOfEveryBlock) {
  torch::nn::Linear dense = Seeded(4, [] { return torch::nn::Linear(3, 12); });
  std::vector<torch::Tensor> shards(2);
  ExpectOk(RunOnTensorParallelRanks(2, false, [&](const ModelParallelGroup& g) {
    ColumnParallelLinear qkv = Seeded(
        4, [&] { return ColumnParallelLinear(ParallelLinearOptions(3, 12).OutputBlocks(3), g); });
    for (int64_t b = 0; b < 3; ++b) {
      EXPECT_TRUE(torch::equal(qkv->weight.narrow(0, 2 * b, 2),
                               dense->weight.narrow(0, 4 * b + 2 * g.rank, 2)));
    }
    EXPECT_EQ(qkv->ShardDims().at("weight"), (ShardSpec{0, 3}));
    shards[g.rank] = qkv->weight.detach().clone();
  }));
  EXPECT_TRUE(torch::equal(MergeShards(shards, ShardSpec{0, 3}), dense->weight));
  EXPECT_TRUE(torch::equal(ShardOf(dense->weight, ShardSpec{0, 3}, 1, 2), shards[1]));
}

// k projection of 2 kv heads (2 features each) at tp = 4: ranks 0-1 hold
// head 0, ranks 2-3 head 1. Each rank's output feeds its own query heads
// (here: its own upstream gradient), so the dense gradient of head h is the
// sum over its two holders: each holder's weight gradient must equal it, the
// input's gradient the dense one; without the replica sum
// (kSkipReplicaGradientSum) the weight gradients are each rank's part only.
constexpr int64_t kReplicaTp = 4, kKvHeads = 2, kKvFeatures = 4;

TEST(ParallelLinearTest, ReplicatedColumnsSumTheirHoldersGradients) {
  constexpr int64_t kTp = kReplicaTp, kHeads = kKvHeads, kFeatures = kKvFeatures;
  const torch::Tensor input = Seeded(7, [] { return torch::randn({kBatch, kSeq, kIn}); });
  std::vector<torch::Tensor> upstream;
  for (int64_t r = 0; r < kTp; ++r) {
    upstream.push_back(Seeded(20 + r, [] {
      return torch::randn({kBatch, kSeq, kKvFeatures / 2});
    }));
  }
  torch::nn::Linear dense = Seeded(5, [] { return torch::nn::Linear(kIn, kKvFeatures); });
  torch::Tensor x = input.clone().requires_grad_(true);
  torch::Tensor y = dense(x);
  torch::Tensor loss = torch::zeros({});
  for (int64_t r = 0; r < kTp; ++r) loss = loss + (y.narrow(2, r / 2 * 2, 2) * upstream[r]).sum();
  loss.backward();

  for (const bool planted : {false, true}) {
    std::vector<torch::Tensor> shards(kTp);
    ExpectOk(RunOnTensorParallelRanks(kTp, false, [&](const ModelParallelGroup& g) {
      ColumnParallelLinear k = Seeded(5, [&] {
        return ColumnParallelLinear(ParallelLinearOptions(kIn, kFeatures).Replicas(kTp / kHeads),
                                    g);
      });
      EXPECT_EQ(k->ShardDims().at("weight"), (ShardSpec{0, 1, 2}));
      const int64_t head = g.rank / 2;
      EXPECT_TRUE(torch::equal(k->weight, dense->weight.narrow(0, head * 2, 2)));
      shards[g.rank] = k->weight.detach().clone();
      (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
      if (planted && g.rank == 0) {
        internal::PlantFault(internal::PlantedFault::kSkipReplicaGradientSum);
      }
      (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
      torch::Tensor px = input.clone().requires_grad_(true);
      (k(px) * upstream[g.rank]).sum().backward();
      (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
      if (g.rank == 0) internal::PlantFault(internal::PlantedFault::kNone);
      const double weight_diff =
          RelativeDiff(k->weight.grad(), dense->weight.grad().narrow(0, head * 2, 2));
      const double bias_diff =
          RelativeDiff(k->bias.grad(), dense->bias.grad().narrow(0, head * 2, 2));
      EXPECT_LE(RelativeDiff(px.grad(), x.grad()), 1e-6) << "input gradient";
      if (planted) {
        EXPECT_GT(weight_diff, 1e-2) << "weight gradient without the replica sum";
        EXPECT_GT(bias_diff, 1e-2) << "bias gradient without the replica sum";
      } else {
        EXPECT_LE(weight_diff, 1e-6) << "weight gradient";
        EXPECT_LE(bias_diff, 1e-6) << "bias gradient";
      }
    }));
    EXPECT_TRUE(torch::equal(MergeShards(shards, ShardSpec{0, 1, 2}), dense->weight));
    EXPECT_TRUE(torch::equal(ShardOf(dense->weight, ShardSpec{0, 1, 2}, 3, kTp), shards[3]));
  }
  const absl::Status refused = RunOnTensorParallelRanks(4, false, [](const ModelParallelGroup& g) {
    ColumnParallelLinear(ParallelLinearOptions(kIn, 4).Replicas(3), g);
  });
  EXPECT_NE(refused.message().find("replicas (3) must divide the tensor-parallel size 4"),
            std::string::npos)
      << refused;
}

// A missing all-reduce in the row-parallel layer: the output is no longer the
// dense layer's (what the equivalence suite's planted bug relies on).
TEST(ParallelLinearTest, AMissingAllReduceIsVisible) {
  torch::nn::Linear dense = Seeded(2, [] { return torch::nn::Linear(8, 3); });
  const torch::Tensor x = Seeded(9, [] { return torch::randn({2, 8}); });
  const torch::Tensor want = dense(x);
  ExpectOk(RunOnTensorParallelRanks(2, false, [&](const ModelParallelGroup& g) {
    RowParallelLinear row = Seeded(2, [&] {
      return RowParallelLinear(ParallelLinearOptions(8, 3).InputIsParallel(false), g);
    });
    EXPECT_LE(RelativeDiff(row(x), want), 1e-6);
    (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
    if (g.rank == 0) internal::PlantFault(internal::PlantedFault::kSkipAllReduce);
    (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
    EXPECT_GT(RelativeDiff(row(x), want), 1e-3);
    (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
    if (g.rank == 0) internal::PlantFault(internal::PlantedFault::kNone);
  }));
}

}  // namespace
}  // namespace tensor_parallel
}  // namespace pp
