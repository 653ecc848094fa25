#include "pipeline/tensor_parallel/sequence_parallel_grads.h"

#include <memory>

#include "gtest/gtest.h"
#include "pipeline/tensor_parallel/linear.h"
#include "pipeline/tensor_parallel/planted_fault.h"
#include "pipeline/tensor_parallel/tp_testing.h"

namespace pp {
namespace tensor_parallel {
namespace {

// Two replicated parameters (a norm's weight and a bias, say) applied to
// each rank's slice over kMicroBatches backwards at tp = 2: rank r's part of
// micro-batch k's gradient is x(k, r), small integers, so every sum is exact.
constexpr int kMicroBatches = 3;

torch::Tensor Part(int64_t k, int64_t rank, int64_t n, int64_t scale) {
  return (torch::arange(n, torch::kFloat) + 10 * rank + 100 * k) * scale;
}

// Runs the micro-batches' backwards on `group` and returns the two
// parameters (their gradients accumulated).
std::pair<torch::Tensor, torch::Tensor> Backwards(const ModelParallelGroup& group) {
  torch::Tensor w = torch::ones({4}).requires_grad_(true);
  torch::Tensor b = torch::zeros({3}).requires_grad_(true);
  for (int k = 0; k < kMicroBatches; ++k) {
    const torch::Tensor loss =
        (SequenceParallelReplicated(w, group) * Part(k, group.rank, 4, 1)).sum() +
        (SequenceParallelReplicated(b, group) * Part(k, group.rank, 3, 2)).sum();
    loss.backward();
  }
  return {w, b};
}

// The whole gradient: every micro-batch's parts summed over both ranks.
torch::Tensor Whole(int64_t n, int64_t scale) {
  torch::Tensor sum = torch::zeros({n});
  for (int k = 0; k < kMicroBatches; ++k) sum += Part(k, 0, n, scale) + Part(k, 1, n, scale);
  return sum;
}

TEST(SequenceParallelGradsTest, NotArmedEachBackwardSums) {
  ExpectOk(RunOnTensorParallelRanks(2, true, [](const ModelParallelGroup& g) {
    ModelParallelGroup group = g;
    group.sequence_parallel_grads = std::make_shared<SequenceParallelGrads>();
    auto [w, b] = Backwards(group);
    EXPECT_TRUE(torch::equal(w.grad(), Whole(4, 1)));
    EXPECT_TRUE(torch::equal(b.grad(), Whole(3, 2)));
    EXPECT_TRUE(group.sequence_parallel_grads->Recorded({w, b}).empty());
  }));
}

// Armed: no collective in any backward (the parameter comes back as is, with
// no autograd node to sum it), the parts accumulate, and one flat all-reduce
// per step makes them the whole gradient: a regression to a sum per
// micro-batch shows as more than one reduction or as a node.
TEST(SequenceParallelGradsTest, ArmedSumsOnceWithOneFlatAllReduce) {
  ExpectOk(RunOnTensorParallelRanks(2, true, [](const ModelParallelGroup& g) {
    ModelParallelGroup group = g;
    auto grads = std::make_shared<SequenceParallelGrads>();
    grads->set_deferred(true);
    group.sequence_parallel_grads = grads;
    torch::Tensor probe = torch::ones({2}).requires_grad_(true);
    EXPECT_TRUE(SequenceParallelReplicated(probe, group).is_same(probe));
    auto [w, b] = Backwards(group);
    torch::Tensor own_w = torch::zeros({4});
    for (int k = 0; k < kMicroBatches; ++k) own_w += Part(k, group.rank, 4, 1);
    EXPECT_TRUE(torch::equal(w.grad(), own_w)) << "partial before the sum";
    torch::Tensor unused = torch::ones({2}).requires_grad_(true);
    const std::vector<torch::Tensor> recorded = grads->Recorded({unused, b, w});
    ASSERT_EQ(recorded.size(), 2u);
    EXPECT_TRUE(recorded[0].is_same(b) && recorded[1].is_same(w)) << "the caller's order";
    EXPECT_EQ(grads->reductions(), 0);
    grads->SumGrads(recorded, group);
    EXPECT_EQ(grads->reductions(), 1);
    EXPECT_TRUE(torch::equal(w.grad(), Whole(4, 1)));
    EXPECT_TRUE(torch::equal(b.grad(), Whole(3, 2)));
  }));
}

TEST(SequenceParallelGradsTest, PlantedFaultsLeaveGradientsPartial) {
  for (internal::PlantedFault fault : {internal::PlantedFault::kSkipSequenceParallelGradSum,
                                       internal::PlantedFault::kSumOneSequenceParallelGrad}) {
    const internal::PlantedFault previous = internal::PlantFault(fault);
    ExpectOk(RunOnTensorParallelRanks(2, true, [](const ModelParallelGroup& g) {
      ModelParallelGroup group = g;
      auto grads = std::make_shared<SequenceParallelGrads>();
      grads->set_deferred(true);
      group.sequence_parallel_grads = grads;
      auto [w, b] = Backwards(group);
      grads->SumGrads(grads->Recorded({w, b}), group);
      EXPECT_FALSE(torch::equal(b.grad(), Whole(3, 2)));
    }));
    internal::PlantFault(previous);
  }
}

}  // namespace
}  // namespace tensor_parallel
}  // namespace pp
