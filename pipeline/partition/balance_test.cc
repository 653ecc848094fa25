#include "pipeline/partition/balance.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace pp {
namespace {

Bounds Balanced(const std::vector<double>& costs, int64_t parts) {
  absl::StatusOr<Bounds> bounds = BalancedBounds(costs, parts);
  EXPECT_TRUE(bounds.ok()) << bounds.status();
  return bounds.ok() ? *bounds : Bounds{};
}

double MaxPart(const std::vector<double>& costs, const Bounds& bounds) {
  std::vector<double> sums = PartCosts(costs, bounds);
  return *std::max_element(sums.begin(), sums.end());
}

// DeepSpeed's published test_partition cases, where its answer is also min-max optimal.
TEST(BalancedBoundsTest, DeepSpeedCases) {
  EXPECT_EQ(Balanced({0, 1, 2, 3, 3, 3}, 4), (Bounds{0, 3, 4, 5, 6}));
  EXPECT_EQ(Balanced({0, 1.1, 1.9, 3, 3, 3}, 4), (Bounds{0, 3, 4, 5, 6}));
  EXPECT_EQ(Balanced({0, 1.1, 30, 3}, 3), (Bounds{0, 2, 3, 4}));
  EXPECT_EQ(Balanced({0, 1.1, 1.9, 3, 30}, 2), (Bounds{0, 4, 5}));
  EXPECT_EQ(Balanced(std::vector<double>(8, 1.0), 4), (Bounds{0, 2, 4, 6, 8}));
}

// DeepSpeed's max-min balancer gives sums [14,5,8] here; the optimum max is 13.
TEST(BalancedBoundsTest, MinMaxWhereDeepSpeedIsNot) {
  Bounds bounds = Balanced({1, 13, 5, 8}, 3);
  EXPECT_EQ(bounds, (Bounds{0, 1, 2, 4}));
  EXPECT_EQ(MaxPart({1, 13, 5, 8}, bounds), 13);
}

TEST(BalancedBoundsTest, EqualCostsMatchUniform) {
  for (int64_t n = 1; n <= 12; ++n) {
    for (int64_t p = 1; p <= n; ++p) {
      EXPECT_EQ(Balanced(std::vector<double>(n, 2.0), p), *UniformBounds(n, p))
          << n << " into " << p;
    }
  }
}

TEST(BalancedBoundsTest, ZeroCostLayersGoToTheEarlierPart) {
  EXPECT_EQ(Balanced({1, 0, 0, 1}, 2), (Bounds{0, 3, 4}));
  EXPECT_EQ(Balanced({0, 0, 0, 0}, 2), (Bounds{0, 3, 4}));
}

TEST(BalancedBoundsTest, RejectsBadInput) {
  absl::StatusOr<Bounds> few = BalancedBounds({1, 2}, 3);
  ASSERT_EQ(few.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(few.status().message().find("2 layers into 3 parts"), std::string::npos)
      << few.status();
  EXPECT_EQ(BalancedBounds({1, -1}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BalancedBounds({1, std::numeric_limits<double>::quiet_NaN()}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BalancedBounds({1}, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// Squares of part costs near 1e154 overflow a double: refused by name, not
// an internal "reconstruction found no cut".
TEST(BalancedBoundsTest, RejectsCostsWhoseSquaresOverflow) {
  for (const std::vector<double>& costs :
       {std::vector<double>{1e154, 1e154, 1.0}, std::vector<double>{8e153, 8e153},
        std::vector<double>{1e308, 1e308}}) {
    absl::StatusOr<Bounds> b = BalancedBounds(costs, 2);
    ASSERT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
    EXPECT_NE(b.status().message().find("costs sum to"), std::string::npos) << b.status();
    EXPECT_NE(b.status().message().find("1e+154"), std::string::npos) << b.status();
  }
  // Large but representable totals still balance.
  EXPECT_EQ(Balanced({1e150, 1e150, 2e150}, 2), (Bounds{0, 2, 3}));
}

TEST(UniformBoundsTest, FirstPartsGetTheRemainder) {
  EXPECT_EQ(*UniformBounds(10, 4), (Bounds{0, 3, 6, 8, 10}));
  EXPECT_EQ(*UniformBounds(8, 4), (Bounds{0, 2, 4, 6, 8}));
  EXPECT_EQ(*UniformBounds(5, 5), (Bounds{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(UniformBounds(3, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateBoundsTest, NamesTheProblem) {
  EXPECT_TRUE(ValidateBounds({0, 2, 5}, 5, 2).ok());
  EXPECT_NE(ValidateBounds({0, 2, 5}, 5, 3).message().find("3 parts need 4"), std::string::npos);
  EXPECT_NE(ValidateBounds({1, 2, 5}, 5, 2).message().find("start at 0"), std::string::npos);
  EXPECT_NE(ValidateBounds({0, 2, 4}, 5, 2).message().find("(5)"), std::string::npos);
  EXPECT_NE(ValidateBounds({0, 2, 2, 5}, 5, 3).message().find("part 1"), std::string::npos);
}

// Every split of n layers into p non-empty parts, by enumeration.
void EnumerateSplits(int64_t n, int64_t p, const std::function<void(const Bounds&)>& visit) {
  Bounds bounds = {0};
  std::function<void(int64_t, int64_t)> rec = [&](int64_t start, int64_t parts_left) {
    if (parts_left == 1) {
      bounds.push_back(n);
      visit(bounds);
      bounds.pop_back();
      return;
    }
    for (int64_t cut = start + 1; cut + parts_left - 1 <= n; ++cut) {
      bounds.push_back(cut);
      rec(cut, parts_left - 1);
      bounds.pop_back();
    }
  };
  rec(0, p);
}

double SumSquares(const std::vector<double>& costs, const Bounds& bounds) {
  double total = 0;
  for (double s : PartCosts(costs, bounds)) total += s * s;
  return total;
}

// Integer costs keep every sum exact, so the brute force and the DP agree
// without tolerance: the optimum max, then the optimum evenness, then the
// latest cuts (lexicographically largest bounds).
TEST(BalancedBoundsTest, MatchesBruteForceOnRandomInputs) {
  std::mt19937 rng(20240601);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 9)(rng);
    const int64_t p = std::uniform_int_distribution<int64_t>(1, n)(rng);
    const int max_cost = trial % 3 == 0 ? 2 : 20;  // Small ranges force many ties.
    std::vector<double> costs(n);
    for (double& c : costs) c = std::uniform_int_distribution<int>(0, max_cost)(rng);

    double best_max = std::numeric_limits<double>::infinity();
    EnumerateSplits(n, p,
                    [&](const Bounds& b) { best_max = std::min(best_max, MaxPart(costs, b)); });
    double best_sq = std::numeric_limits<double>::infinity();
    Bounds expected;
    EnumerateSplits(n, p, [&](const Bounds& b) {
      if (MaxPart(costs, b) != best_max) return;
      const double sq = SumSquares(costs, b);
      if (sq < best_sq || (sq == best_sq && b > expected)) {
        best_sq = sq;
        expected = b;
      }
    });
    const Bounds got = Balanced(costs, p);
    ASSERT_TRUE(ValidateBounds(got, n, p).ok());
    EXPECT_EQ(MaxPart(costs, got), best_max) << "trial " << trial;
    EXPECT_EQ(got, expected) << "trial " << trial;
  }
}

PartMemory Memory(std::vector<double> fixed, std::vector<double> activations,
                  std::vector<double> in_flight, double cap) {
  return PartMemory{std::move(fixed), std::move(activations), std::move(in_flight), cap};
}

// Six equal layers on 2 stages of 1F1B (2 and 1 micro-batches in flight), one
// activation byte each: the time-balanced [0,3,6] puts 3 x 2 = 6 bytes on
// stage 0. A cap of 4 allows at most 2 layers there (2 x 2 = 4) and the other
// 4 fit stage 1 (4 x 1 = 4): [0,2,6]. A cap of 6 does not bind: [0,3,6].
TEST(MemoryBoundedBoundsTest, CapMovesLayersOffTheFirstStageOnlyWhereItBinds) {
  const std::vector<double> costs(6, 1.0);
  absl::StatusOr<Bounds> bound =
      MemoryBoundedBounds(costs, 2, Memory({0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1}, {2, 1}, 4));
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(*bound, (Bounds{0, 2, 6}));
  absl::StatusOr<Bounds> loose =
      MemoryBoundedBounds(costs, 2, Memory({0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1}, {2, 1}, 6));
  ASSERT_TRUE(loose.ok()) << loose.status();
  EXPECT_EQ(*loose, Balanced(costs, 2));
  EXPECT_EQ(*loose, (Bounds{0, 3, 6}));
  EXPECT_EQ(PartBytes(Memory({0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1}, {2, 1}, 4), *bound),
            (std::vector<double>{4, 4}));
}

// 1F1B at p = 4 (4, 3, 2, 1 in flight), eight equal layers, one byte each,
// cap 6: stages may own at most 1, 2, 3 and 6 layers. 8 layers need a max of
// 3 (1 + 2 + 2 + 2 = 7 < 8); of the splits with max 3, (1,2,2,3) and
// (1,2,3,2) have the least squares (18); ties fill earlier parts: [0,1,3,6,8].
// Unbounded it would be [0,2,4,6,8] with 8 bytes on stage 0.
TEST(MemoryBoundedBoundsTest, OneFOneBAtFourStages) {
  const std::vector<double> costs(8, 1.0);
  const PartMemory memory =
      Memory(std::vector<double>(8, 0), std::vector<double>(8, 1), {4, 3, 2, 1}, 6);
  absl::StatusOr<Bounds> bounds = MemoryBoundedBounds(costs, 4, memory);
  ASSERT_TRUE(bounds.ok()) << bounds.status();
  EXPECT_EQ(*bounds, (Bounds{0, 1, 3, 6, 8}));
  EXPECT_EQ(Balanced(costs, 4), (Bounds{0, 2, 4, 6, 8}));
  EXPECT_EQ(PartBytes(memory, Balanced(costs, 4)), (std::vector<double>{8, 6, 4, 2}));
}

// Fixed bytes (parameters and state) count once, activations per micro-batch
// in flight: 2 + 2 x 1 = 4 bytes per layer on stage 0, 3 on stage 1. Cap 6:
// stage 0 takes one layer (two would be 8), stage 1 then needs three (9 > 6).
// The error names the over-cap stage of the time-balanced split, [0,2,4]:
// stage 0 at 4 + 2 x 2 = 8 bytes (stage 1 there is 6, within the cap).
TEST(MemoryBoundedBoundsTest, NothingFitsNamesTheStageItsBytesAndTheCap) {
  absl::StatusOr<Bounds> bounds =
      MemoryBoundedBounds({1, 1, 1, 1}, 2, Memory({2, 2, 2, 2}, {1, 1, 1, 1}, {2, 1}, 6));
  ASSERT_FALSE(bounds.ok());
  const std::string message(bounds.status().message());
  EXPECT_NE(message.find("cap of 6 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("stage (part) 0 layers [0, 2): 8 bytes = 4 parameters/state + 2 "
                         "activation bytes x 2"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("stage (part) 1"), std::string::npos) << message;
}

TEST(MemoryBoundedBoundsTest, BadSizesAndValues) {
  EXPECT_FALSE(MemoryBoundedBounds({1, 1}, 2, Memory({0}, {1, 1}, {2, 1}, 4)).ok());
  EXPECT_FALSE(MemoryBoundedBounds({1, 1}, 2, Memory({0, 0}, {1, 1}, {2}, 4)).ok());
  EXPECT_FALSE(MemoryBoundedBounds({1, 1}, 2, Memory({0, -1}, {1, 1}, {2, 1}, 4)).ok());
  EXPECT_FALSE(MemoryBoundedBounds({1, 1}, 2, Memory({0, 0}, {1, 1}, {2, 1}, 0)).ok());
  EXPECT_FALSE(MemoryBoundedBounds({1}, 2, Memory({0}, {1}, {2, 1}, 4)).ok());
}

// Random cases: the bounded split fits the cap, and is the unbounded one
// whenever that one fits.
TEST(MemoryBoundedBoundsTest, RandomCasesFitAndAgreeWhereTheCapIsLoose) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> unit(0.1, 2.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 3 + trial % 8;
    const int p = 1 + trial % std::min(n, 4);
    std::vector<double> costs(n), fixed(n), act(n), in_flight(p);
    for (int i = 0; i < n; ++i) {
      costs[i] = unit(rng);
      fixed[i] = unit(rng);
      act[i] = unit(rng);
    }
    for (int s = 0; s < p; ++s) in_flight[s] = p - s;
    const Bounds unbounded = Balanced(costs, p);
    std::vector<double> bytes = PartBytes(Memory(fixed, act, in_flight, 1), unbounded);
    const double peak = *std::max_element(bytes.begin(), bytes.end());
    // Just above the peak: prefix differences and PartBytes' sums may round
    // differently at exact equality.
    const double loose = peak * (1 + 1e-9);
    for (double cap : {loose, peak * 0.8, peak * 0.6}) {
      absl::StatusOr<Bounds> bounded =
          MemoryBoundedBounds(costs, p, Memory(fixed, act, in_flight, cap));
      if (cap == loose) {
        ASSERT_TRUE(bounded.ok()) << bounded.status();
      }
      if (!bounded.ok()) continue;
      for (double b : PartBytes(Memory(fixed, act, in_flight, cap), *bounded)) EXPECT_LE(b, cap);
      if (cap == loose) {
        EXPECT_EQ(*bounded, unbounded);
      }
      EXPECT_GE(MaxPart(costs, *bounded), MaxPart(costs, unbounded));
    }
  }
}

}  // namespace
}  // namespace pp
