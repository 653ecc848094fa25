#include "pipeline/runtime/optimizer.h"

#include <cmath>

#include <gtest/gtest.h>

namespace pp {
namespace {

TEST(OptimizerTest, ValidatesNames) {
  OptimizerConfig c;
  c.name = "lamb";
  absl::Status s = ValidateOptimizerConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("sgd, adamw"), std::string::npos);
  LrScheduleConfig l;
  l.name = "warmup_cosine";
  l.warmup_steps = 5;
  l.total_steps = 5;
  EXPECT_EQ(ValidateLrSchedule(l).code(), absl::StatusCode::kInvalidArgument);
}

TEST(OptimizerTest, WarmupCosine) {
  LrScheduleConfig l;
  l.name = "warmup_cosine";
  l.warmup_steps = 2;
  l.total_steps = 6;
  l.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(LearningRateAt(l, 1.0, 0), 0.5);
  EXPECT_DOUBLE_EQ(LearningRateAt(l, 1.0, 1), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateAt(l, 1.0, 2), 1.0);
  EXPECT_NEAR(LearningRateAt(l, 1.0, 4), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_DOUBLE_EQ(LearningRateAt(l, 1.0, 6), 0.1);
  EXPECT_DOUBLE_EQ(LearningRateAt(l, 1.0, 100), 0.1);
  EXPECT_DOUBLE_EQ(LearningRateAt(LrScheduleConfig{}, 0.3, 7), 0.3);
}

TEST(OptimizerTest, SetLearningRateReachesTheOptimizer) {
  torch::Tensor p = torch::ones({1}, torch::requires_grad());
  OptimizerConfig c;
  c.name = "sgd";
  c.lr = 1.0;
  auto opt = MakeOptimizer(c, {p});
  SetLearningRate(*opt, 0.25);
  p.mutable_grad() = torch::ones({1});
  opt->step();
  EXPECT_FLOAT_EQ(p.item<float>(), 0.75f);
}

}  // namespace
}  // namespace pp
