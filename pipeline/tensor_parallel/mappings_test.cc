#include "pipeline/tensor_parallel/mappings.h"

#include "gtest/gtest.h"
#include "pipeline/tensor_parallel/planted_fault.h"
#include "pipeline/tensor_parallel/tp_testing.h"

namespace pp {
namespace tensor_parallel {
namespace {

// Every test runs on 2 thread ranks with a real Gloo group; rank r feeds
// values that differ by rank, so a missing or misplaced collective shows.
constexpr int kTp = 2;

torch::Tensor Leaf(const torch::Tensor& t) { return t.clone().requires_grad_(true); }

TEST(MappingsTest, CopyIsIdentityForwardAndAllReduceBackward) {
  ExpectOk(RunOnTensorParallelRanks(kTp, false, [](const ModelParallelGroup& g) {
    torch::Tensor x = Leaf(torch::arange(6, torch::kFloat32).reshape({2, 3}));
    torch::Tensor y = CopyToTensorParallelRegion(x, g);
    EXPECT_TRUE(torch::equal(y, x));
    (y * (g.rank + 1)).sum().backward();
    // (1 + 2) from the two ranks' upstream gradients.
    EXPECT_TRUE(torch::equal(x.grad(), torch::full({2, 3}, 3.0f)));
  }));
}

TEST(MappingsTest, ReduceIsAllReduceForwardAndIdentityBackward) {
  ExpectOk(RunOnTensorParallelRanks(kTp, false, [](const ModelParallelGroup& g) {
    torch::Tensor x = Leaf(torch::full({4}, 1.0f + g.rank));
    torch::Tensor y = ReduceFromTensorParallelRegion(x, g);
    EXPECT_TRUE(torch::equal(y, torch::full({4}, 3.0f)));
    (y * (g.rank + 1)).sum().backward();
    EXPECT_TRUE(torch::equal(x.grad(), torch::full({4}, 1.0f + g.rank)));
  }));
}

TEST(MappingsTest, ScatterAndGatherAlongTheLastDimensionAreConjugate) {
  ExpectOk(RunOnTensorParallelRanks(kTp, false, [](const ModelParallelGroup& g) {
    const torch::Tensor whole = torch::arange(12, torch::kFloat32).reshape({3, 4});
    torch::Tensor x = Leaf(whole);
    torch::Tensor mine = ScatterToTensorParallelRegion(x, g);
    EXPECT_TRUE(torch::equal(mine, whole.narrow(1, 2 * g.rank, 2)));
    torch::Tensor back = GatherFromTensorParallelRegion(mine, g);
    EXPECT_TRUE(torch::equal(back, whole));
    // Gather's backward keeps this rank's columns of the upstream
    // gradient; scatter's backward all-gathers them into place.
    (back * (g.rank + 1)).sum().backward();
    torch::Tensor expected = torch::empty({3, 4});
    expected.narrow(1, 0, 2).fill_(1.0f);
    expected.narrow(1, 2, 2).fill_(2.0f);
    EXPECT_TRUE(torch::equal(x.grad(), expected)) << x.grad();
  }));
}

TEST(MappingsTest, SequenceGatherIsAllGatherForwardAndReduceScatterBackward) {
  ExpectOk(RunOnTensorParallelRanks(kTp, true, [](const ModelParallelGroup& g) {
    // [batch 3, seq shard 2, hidden 5]
    torch::Tensor x = Leaf(torch::full({3, 2, 5}, 1.0f + g.rank));
    torch::Tensor y = GatherFromSequenceParallelRegion(x, g, 1);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 4, 5}));
    EXPECT_TRUE(torch::equal(y.narrow(1, 0, 2), torch::full({3, 2, 5}, 1.0f)));
    EXPECT_TRUE(torch::equal(y.narrow(1, 2, 2), torch::full({3, 2, 5}, 2.0f)));
    torch::Tensor upstream = torch::arange(60, torch::kFloat32).reshape({3, 4, 5});
    (y * upstream * (g.rank + 1)).sum().backward();
    // Sum over ranks (1 + 2) of the upstream, this rank's sequence slice.
    EXPECT_TRUE(torch::equal(x.grad(), 3 * upstream.narrow(1, 2 * g.rank, 2)));
  }));
}

TEST(MappingsTest, SequenceReduceScatterIsConjugateOfGather) {
  ExpectOk(RunOnTensorParallelRanks(kTp, true, [](const ModelParallelGroup& g) {
    const torch::Tensor base = torch::arange(24, torch::kFloat32).reshape({2, 4, 3});
    torch::Tensor x = Leaf(base * (g.rank + 1));
    torch::Tensor y = ReduceScatterToSequenceParallelRegion(x, g, 1);
    EXPECT_TRUE(torch::equal(y, 3 * base.narrow(1, 2 * g.rank, 2)));
    y.sum().backward();
    EXPECT_TRUE(torch::equal(x.grad(), torch::ones({2, 4, 3})));
    torch::Tensor s = Leaf(base);
    EXPECT_TRUE(
        torch::equal(ScatterToSequenceParallelRegion(s, g, 1), base.narrow(1, 2 * g.rank, 2)));
  }));
}

TEST(MappingsTest, ADimensionThatDoesNotDivideIsRefusedWithBothNumbers) {
  const absl::Status status = RunOnTensorParallelRanks(kTp, true, [](const ModelParallelGroup& g) {
    ScatterToSequenceParallelRegion(torch::zeros({2, 5, 3}), g, 1);
  });
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("(5) must be a multiple of the tensor-parallel size 2"),
            std::string::npos)
      << status;
}

TEST(MappingsTest, DenseGroupsAreTheIdentityWithoutCommunication) {
  ModelParallelGroup dense;  // size 1, no group: any collective would crash
  torch::Tensor x = torch::randn({2, 4, 6});
  EXPECT_TRUE(CopyToTensorParallelRegion(x, dense).is_same(x));
  EXPECT_TRUE(ReduceFromTensorParallelRegion(x, dense).is_same(x));
  EXPECT_TRUE(GatherFromSequenceParallelRegion(x, dense, 1).is_same(x));
  EXPECT_TRUE(ReduceScatterToSequenceParallelRegion(x, dense, 1).is_same(x));
}

// The planted faults the equivalence suite relies on change what these
// functions compute (and are off again afterwards).
TEST(MappingsTest, PlantedFaultsChangeTheResult) {
  ExpectOk(RunOnTensorParallelRanks(kTp, false, [](const ModelParallelGroup& g) {
    const torch::Tensor whole = torch::arange(8, torch::kFloat32).reshape({2, 4});
    torch::Tensor x = torch::full({4}, 1.0f + g.rank);
    if (g.rank == 0) internal::PlantFault(internal::PlantedFault::kSkipAllReduce);
    (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
    EXPECT_FALSE(torch::equal(ReduceFromTensorParallelRegion(x, g), torch::full({4}, 3.0f)));
    (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
    if (g.rank == 0) internal::PlantFault(internal::PlantedFault::kWrongSlice);
    (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
    EXPECT_FALSE(
        torch::equal(ScatterToTensorParallelRegion(whole, g), whole.narrow(1, 2 * g.rank, 2)));
    (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
    if (g.rank == 0) internal::PlantFault(internal::PlantedFault::kNone);
    (void)AllGather(torch::zeros({1}), g, 0, "a barrier");
    EXPECT_TRUE(torch::equal(ReduceFromTensorParallelRegion(x, g), torch::full({4}, 3.0f)));
  }));
}

}  // namespace
}  // namespace tensor_parallel
}  // namespace pp
