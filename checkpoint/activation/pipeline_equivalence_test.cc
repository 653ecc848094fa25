// Activation checkpointing (recompute in backward) set through the Trainer's
// LayerRunner keeps the runtime's equivalence: a pipeline whose Block layers
// are recomputed trains exactly like ToSequential() without recompute. Lives
// here, above pipeline/runtime, so the runtime's test library does not depend
// on checkpoint/.
#include <string>

#include <gtest/gtest.h>

#include "checkpoint/activation/activation_checkpointing.h"
#include "pipeline/runtime/equivalence_testing.h"

namespace pp {
namespace testing_runtime {
namespace {

constexpr double kRtol = 1e-5;

TEST(CheckpointedPipelineTest, MatchesSequential) {
  ActivationCheckpointPolicy policy;
  policy.interval = 1;
  policy.checkpointable_types = "Block";
  absl::StatusOr<LayerRunner> runner = MakeCheckpointingRunner(policy);
  ASSERT_TRUE(runner.ok()) << runner.status();
  for (const std::string schedule : {"1f1b", "interleaved_1f1b"}) {
    RunConfig c;
    c.schedule = schedule;
    c.pp = 2;
    c.chunks = schedule == "1f1b" ? 1 : 2;
    c.optimizer.lr = 0.1;
    c.optimizer.momentum = 0.9;
    c.layer_runner = *runner;
    absl::StatusOr<RunResult> pipeline = TrainPipeline(c);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    absl::StatusOr<RunResult> sequential = TrainSequential(c);
    ASSERT_TRUE(sequential.ok()) << sequential.status();
    EXPECT_EQ(CompareResults(*sequential, *pipeline, kRtol), "") << schedule;
  }
}

}  // namespace
}  // namespace testing_runtime
}  // namespace pp
