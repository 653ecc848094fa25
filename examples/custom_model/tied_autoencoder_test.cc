// The custom model through pipe: cut into 2 pipeline stages (encoder and
// decoder, which share one weight, on different stages), trained by the
// Trainer on thread ranks, it equals its sequential self and learns.
#include "examples/custom_model/tied_autoencoder.h"

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "pipeline/runtime/equivalence_testing.h"

namespace custom_model {
namespace {

using pp::testing_runtime::CompareResults;
using pp::testing_runtime::RunConfig;
using pp::testing_runtime::RunResult;

RunConfig Autoencoder(const std::string& schedule, int pp, int dp) {
  RunConfig c;
  c.schedule = schedule;
  c.pp = pp;
  c.dp = dp;
  c.microbatches = 4;
  c.specs = [] { return TiedAutoencoderSpecs(2); };
  c.loss = ReconstructionLoss;
  c.source = [] { return std::make_unique<LowRankSource>(8, 7); };
  c.optimizer.name = "sgd";
  c.optimizer.lr = 0.05;
  c.optimizer.momentum = 0.9;
  return c;
}

TEST(TiedAutoencoderTest, PipelineEqualsSequential) {
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    for (int dp : {1, 2}) {
      SCOPED_TRACE(schedule + " dp=" + std::to_string(dp));
      RunConfig c = Autoencoder(schedule, 2, dp);
      absl::StatusOr<RunResult> pipeline = pp::testing_runtime::TrainPipeline(c);
      ASSERT_TRUE(pipeline.ok()) << pipeline.status();
      absl::StatusOr<RunResult> sequential = pp::testing_runtime::TrainSequential(c);
      ASSERT_TRUE(sequential.ok()) << sequential.status();
      EXPECT_EQ(CompareResults(*sequential, *pipeline, 1e-5), "");
    }
  }
}

TEST(TiedAutoencoderTest, EncoderAndDecoderShareOneWeight) {
  absl::StatusOr<RunResult> r = pp::testing_runtime::TrainPipeline(Autoencoder("1f1b", 2, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  int code_params = 0;
  for (const auto& [name, value] : r->params) {
    if (name.find("code") != std::string::npos) {
      ++code_params;
      EXPECT_EQ(value.sizes(), (std::vector<int64_t>{kCode, kFeatures})) << name;
    }
  }
  EXPECT_EQ(code_params, 1);
}

TEST(TiedAutoencoderTest, LearnsOnTwoStages) {
  RunConfig c = Autoencoder("1f1b", 2, 1);
  c.steps = 60;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 0.02;
  c.optimizer.momentum = 0;
  absl::StatusOr<RunResult> r = pp::testing_runtime::TrainPipeline(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(r->losses.back(), 0.3 * r->losses.front())
      << r->losses.front() << " -> " << r->losses.back();
}

TEST(LowRankSourceTest, DeterministicPerStepAndIndex) {
  LowRankSource a(8, 7), b(8, 7);
  absl::StatusOr<pp::MicroBatchData> x = a.Get(3, 5), y = b.Get(3, 5), z = a.Get(3, 6);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  EXPECT_TRUE(torch::equal(x->inputs[0], y->inputs[0]));
  EXPECT_FALSE(torch::equal(x->inputs[0], z->inputs[0]));
  EXPECT_NE(x->batch.id, z->batch.id);
  EXPECT_EQ(a.Get(-1, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace custom_model
