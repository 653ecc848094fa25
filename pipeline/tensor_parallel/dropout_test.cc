#include "pipeline/tensor_parallel/dropout.h"

#include <gtest/gtest.h>

namespace pp {
namespace tensor_parallel {
namespace {

ModelParallelGroup Rank(int64_t rank, int64_t size) {
  ModelParallelGroup group;  // no collective is needed: the group's position only
  group.rank = rank;
  group.size = size;
  return group;
}

// Each rank's slice of the dense tensor, dropped out from the same generator
// state, is the slice of torch::dropout's result, output and gradient, and
// leaves the generator where the dense dropout left it.
void ExpectSlicesOfDenseDropout(torch::Dtype dtype, int64_t dim, int64_t tp) {
  SCOPED_TRACE(::testing::Message() << dtype << " dim " << dim << " tp " << tp);
  constexpr double kP = 0.3;
  // [batch 3, heads 4, 5, 7]: odd sizes everywhere but the split one.
  const torch::Tensor x = torch::randn({3, 4, 5, 7}).to(dtype);
  torch::manual_seed(11);
  torch::Tensor dense_in = x.clone().requires_grad_(true);
  torch::Tensor dense = torch::dropout(dense_in, kP, /*train=*/true);
  dense.sum().backward();
  const double after_dense = torch::rand({1}).item<double>();
  const int64_t n = x.size(dim) / tp;
  for (int64_t r = 0; r < tp; ++r) {
    torch::manual_seed(11);
    torch::Tensor local_in = x.narrow(dim, r * n, n).clone().requires_grad_(true);
    torch::Tensor local = ShardedDropout(local_in, kP, /*training=*/true, dim, Rank(r, tp));
    local.sum().backward();
    EXPECT_TRUE(torch::equal(local, dense.narrow(dim, r * n, n))) << "rank " << r;
    EXPECT_TRUE(torch::equal(local_in.grad(), dense_in.grad().narrow(dim, r * n, n)))
        << "rank " << r;
    EXPECT_EQ(torch::rand({1}).item<double>(), after_dense) << "rank " << r;
  }
}

TEST(ShardedDropoutTest, EachRankHoldsItsSliceOfTheDenseMask) {
  for (torch::Dtype dtype : {torch::kFloat, torch::kBFloat16}) {
    ExpectSlicesOfDenseDropout(dtype, /*dim=*/1, /*tp=*/2);
    ExpectSlicesOfDenseDropout(dtype, /*dim=*/1, /*tp=*/4);
    ExpectSlicesOfDenseDropout(dtype, /*dim=*/-1, /*tp=*/1);
  }
}

TEST(ShardedDropoutTest, AMaskDrawnForTheSliceOnlyIsNotTheDenseOne) {
  // What a per-rank draw (dropout of the slice alone) would give: rank 1's
  // slice then reuses rank 0's noise, not the dense tensor's.
  const torch::Tensor x = torch::ones({2, 4, 8, 8});
  torch::manual_seed(3);
  const torch::Tensor dense = torch::dropout(x, 0.5, true);
  torch::manual_seed(3);
  const torch::Tensor alone = torch::dropout(x.narrow(1, 2, 2), 0.5, true);
  EXPECT_FALSE(torch::equal(alone, dense.narrow(1, 2, 2)));
  torch::manual_seed(3);
  EXPECT_TRUE(torch::equal(ShardedDropout(x.narrow(1, 2, 2), 0.5, true, 1, Rank(1, 2)),
                           dense.narrow(1, 2, 2)));
}

TEST(ShardedDropoutTest, IdentityWhenNotTrainingOrPZero) {
  const torch::Tensor x = torch::randn({2, 6});
  EXPECT_TRUE(ShardedDropout(x, 0.5, /*training=*/false, 1, Rank(0, 2)).is_same(x));
  EXPECT_TRUE(ShardedDropout(x, 0.0, /*training=*/true, 1, Rank(1, 2)).is_same(x));
  EXPECT_THROW(ShardedDropout(x, 1.0, true, 1, Rank(0, 2)), c10::Error);
}

}  // namespace
}  // namespace tensor_parallel
}  // namespace pp
