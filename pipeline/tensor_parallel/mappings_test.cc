#include "pipeline/tensor_parallel/mappings.h"

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
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

// The asynchronous forms are the blocking forms' Gloo operations: the same
// bits (fp32 and bf16, which travels as float32), with several in flight at
// once and waited for out of order.
TEST(MappingsTest, StartedCollectivesGiveTheBlockingFormsBits) {
  ExpectOk(RunOnTensorParallelRanks(kTp, false, [](const ModelParallelGroup& g) {
    const torch::Tensor mine = torch::randn({3, 5}, torch::TensorOptions().dtype(torch::kFloat32))
                                   .mul(1.0 + g.rank)
                                   .add(0.1 * g.rank);
    for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
      const torch::Tensor x = mine.to(dtype);
      torch::Tensor sum = x.clone();
      AllReduceInPlace(sum, g, ReduceOp::kSum, "a sum");
      torch::Tensor broadcast = x.clone();
      Broadcast(broadcast, g, 1, "a broadcast");
      const torch::Tensor gathered = AllGather(x, g, 0, "a gather");

      PendingCollective started_sum = StartAllReduce(x.clone(), g, ReduceOp::kSum, "a sum");
      PendingCollective started_broadcast = StartBroadcast(x.clone(), g, 1, "a broadcast");
      PendingCollective started_gather = StartAllGather(x, g, 0, "a gather");
      absl::StatusOr<torch::Tensor> got_gather = started_gather.Wait();
      absl::StatusOr<torch::Tensor> got_broadcast = started_broadcast.Wait();
      absl::StatusOr<torch::Tensor> got_sum = started_sum.Wait();
      EXPECT_TRUE(started_sum.Completed());  // emptied by its Wait
      EXPECT_TRUE(PendingCollective::Done(x).Completed());
      ASSERT_TRUE(got_sum.ok() && got_broadcast.ok() && got_gather.ok());
      EXPECT_EQ(got_sum->scalar_type(), dtype);
      EXPECT_EQ(got_gather->scalar_type(), dtype);
      EXPECT_TRUE(torch::equal(*got_sum, sum));
      EXPECT_TRUE(torch::equal(*got_broadcast, broadcast));
      EXPECT_TRUE(torch::equal(*got_gather, gathered));
      EXPECT_FALSE(torch::equal(*got_sum, x));  // it did communicate
    }
  }));
}

// A planted skip skips the started forms too (nothing to wait for), as the
// equivalence suite's planted bugs need under asynchronous collectives.
// A barrier no planted fault skips.
void Barrier(const ModelParallelGroup& g) {
  torch::Tensor t = torch::zeros({1});
  Broadcast(t, g, 0, "a barrier");
}

TEST(MappingsTest, StartedCollectivesHonourPlantedFaults) {
  ExpectOk(RunOnTensorParallelRanks(kTp, false, [](const ModelParallelGroup& g) {
    const torch::Tensor x = torch::full({4}, 1.0f + g.rank);
    Barrier(g);
    if (g.rank == 0) internal::PlantFault(internal::PlantedFault::kSkipAllReduce);
    Barrier(g);
    absl::StatusOr<torch::Tensor> sum =
        StartAllReduce(x.clone(), g, ReduceOp::kSum, "a sum").Wait();
    ASSERT_TRUE(sum.ok());
    EXPECT_TRUE(torch::equal(*sum, x));
    Barrier(g);
    if (g.rank == 0) internal::PlantFault(internal::PlantedFault::kSkipAllGather);
    Barrier(g);
    absl::StatusOr<torch::Tensor> gathered = StartAllGather(x, g, 0, "a gather").Wait();
    ASSERT_TRUE(gathered.ok());
    EXPECT_TRUE(torch::equal(*gathered, torch::cat({x, x})));
    Barrier(g);
    if (g.rank == 0) internal::PlantFault(internal::PlantedFault::kNone);
    Barrier(g);
    sum = StartAllReduce(x.clone(), g, ReduceOp::kSum, "a sum").Wait();
    ASSERT_TRUE(sum.ok());
    EXPECT_TRUE(torch::equal(*sum, torch::full({4}, 3.0f)));
  }));
}

// A work that never completes: LibTorch's wait throws when its timeout
// expires.
class NeverDone : public c10d::Work {
 public:
  bool wait(std::chrono::milliseconds timeout) override {
    waited_for = timeout;
    TORCH_CHECK(false, "Operation timed out!");
  }
  std::chrono::milliseconds waited_for{0};
};

// A peer that never joins: the wait ends after the group's timeout with a
// Status naming the collective and the group, instead of hanging; the finish
// step never runs.
TEST(MappingsTest, AStartedCollectiveWaitsAtMostItsTimeout) {
  auto work = c10::make_intrusive<NeverDone>();
  bool finished = false;
  PendingCollective pending(WorkPtr(work), "all-reduce of a lonely sum", "a group of two",
                            std::chrono::milliseconds(300), [&] {
                              finished = true;
                              return torch::Tensor();
                            });
  EXPECT_FALSE(pending.Completed());
  absl::StatusOr<torch::Tensor> sum = pending.Wait();
  ASSERT_FALSE(sum.ok());
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kDeadlineExceeded) << sum.status();
  EXPECT_NE(sum.status().message().find("all-reduce of a lonely sum on a group of two"),
            std::string::npos)
      << sum.status();
  EXPECT_EQ(work->waited_for, std::chrono::milliseconds(300));
  EXPECT_FALSE(finished);
}

}  // namespace
}  // namespace tensor_parallel
}  // namespace pp
