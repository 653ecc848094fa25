// What the equivalence suite (:equivalence_suite, which runs the built-in
// schedules in :equivalence_suite_test) does not vary: clipping
// with an LR schedule, receives in program order, and a teeth test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "pipeline/runtime/equivalence_testing.h"

namespace pp {
namespace testing_runtime {
namespace {

constexpr double kRtol = 1e-5;

RunConfig ClippedConfig() {
  RunConfig c;
  c.schedule = "1f1b";
  c.pp = 2;
  c.dp = 2;
  c.optimizer.name = "sgd";
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.9;
  c.max_grad_norm = 0.05;  // well below the toy model's norms: clipping is active
  c.lr_schedule.name = "warmup_cosine";
  c.lr_schedule.warmup_steps = 1;
  c.lr_schedule.total_steps = 3;
  return c;
}

// Global-norm clipping (norm over pipe and data groups, tied weight counted
// once) and a warm-up + cosine LR schedule keep the equivalence.
TEST(EquivalenceExtraTest, ClippingAndLrScheduleMatchSequential) {
  RunConfig c = ClippedConfig();
  absl::StatusOr<RunResult> pipeline = TrainPipeline(c);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  absl::StatusOr<RunResult> sequential = TrainSequential(c);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  ASSERT_GT(sequential->grad_norms[0], c.max_grad_norm);
  EXPECT_EQ(CompareResults(*sequential, *pipeline, kRtol), "");
}

// The distributed optimizer's planted bugs (a bucket's gradients summed
// twice; a slice left out of the norm, so clipping scales by the wrong
// factor) fall outside the suite's tolerance, where the correct one is
// inside it.
TEST(EquivalenceExtraTest, DistributedOptimizerPlantedFaultsAreDetected) {
  RunConfig c = ClippedConfig();
  c.distributed_optimizer = true;
  c.bucket_numel = 100;
  absl::StatusOr<RunResult> sequential = TrainSequential(c);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  absl::StatusOr<RunResult> right = TrainPipeline(c);
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_EQ(CompareResults(*sequential, *right, kRtol), "");
  using Fault = DistributedOptimizerOptions::PlantedFault;
  for (Fault fault : {Fault::kBucketReducedTwice, Fault::kSliceLeftOutOfNorm}) {
    c.distributed_optimizer_fault = fault;
    absl::StatusOr<RunResult> wrong = TrainPipeline(c);
    ASSERT_TRUE(wrong.ok()) << wrong.status();
    EXPECT_NE(CompareResults(*sequential, *wrong, kRtol), "") << static_cast<int>(fault);
  }
}

// Per-token loss (micro_batch_source.h) on variable shapes: the pipeline
// matches the reference at pp 2 x dp 2 under ZB-V's split backward, and
// planting the mean of micro-batch means (each micro-batch's sum over its own
// tokens) moves losses and weights out of the bound. Static p2p shapes
// cannot carry shapes that vary: the first differing send fails, naming the
// option.
TEST(EquivalenceExtraTest, PerTokenLossPlantedFaultIsDetected) {
  RunConfig c;
  c.schedule = "zbv";
  c.pp = 2;
  c.dp = 2;
  c.chunks = 2;
  c.microbatches = 4;
  c.optimizer.lr = 0.1;
  c.varlen_seed = 7;
  absl::StatusOr<RunResult> sequential = TrainSequential(c);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  absl::StatusOr<RunResult> right = TrainPipeline(c);
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_EQ(CompareResults(*sequential, *right, kRtol), "");
  c.loss_normalization_fault = LossNormalizationFault::kMicroBatchMean;
  absl::StatusOr<RunResult> wrong = TrainPipeline(c);
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  EXPECT_NE(CompareResults(*sequential, *wrong, kRtol), "");

  c.loss_normalization_fault = LossNormalizationFault::kNone;
  c.p2p_static_shapes = true;
  c.timeout = std::chrono::seconds(3);
  absl::StatusOr<RunResult> static_shapes = TrainPipeline(c);
  ASSERT_FALSE(static_shapes.ok());
  EXPECT_THAT(std::string(static_shapes.status().message()),
              ::testing::HasSubstr("p2p_static_shapes"));
}

// A source that marks tokens without naming the global count (or the
// reverse) is refused at its first micro-batch, naming both.
TEST(EquivalenceExtraTest, InconsistentPerTokenSourceIsRefused) {
  class Broken : public MicroBatchSource {
   public:
    absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override {
      absl::StatusOr<MicroBatchData> d = inner_.Get(step, index);
      if (d.ok()) d->global_loss_tokens = 0;
      return d;
    }
    VarlenToySource inner_{3, 4};
  };
  RunConfig c;
  c.pp = 2;
  c.microbatches = 4;
  c.source = [] { return std::make_unique<Broken>(); };
  c.timeout = std::chrono::seconds(3);  // the other stage waits for the refused one
  absl::StatusOr<RunResult> run = TrainPipeline(c);
  ASSERT_FALSE(run.ok());
  EXPECT_THAT(std::string(run.status().message()), ::testing::HasSubstr("global_loss_tokens = 0"));
}

// Receives executed exactly where the lowered program puts them (no
// deferral) train the same.
TEST(EquivalenceExtraTest, ReceivesInProgramOrderMatchSequential) {
  for (const std::string schedule : {"1f1b", "interleaved_1f1b"}) {
    RunConfig c;
    c.schedule = schedule;
    c.pp = 2;
    c.dp = 2;
    c.chunks = schedule == "1f1b" ? 1 : 2;
    c.optimizer.lr = 0.1;
    c.defer_receives = false;
    absl::StatusOr<RunResult> pipeline = TrainPipeline(c);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    absl::StatusOr<RunResult> sequential = TrainSequential(c);
    ASSERT_TRUE(sequential.ok()) << sequential.status();
    EXPECT_EQ(CompareResults(*sequential, *pipeline, kRtol), "") << schedule;
  }
}

// Receives posted ahead of need (StageExecutorOptions::post_receives_ahead)
// train exactly as without, and as the sequential model: 1F1B, interleaved
// 1F1B and ZBV (V placement: each rank hands over locally between its two
// chunks), with dynamic and with static p2p shapes (control words ahead /
// payloads ahead).
TEST(EquivalenceExtraTest, ReceivesPostedAheadTrainTheSame) {
  for (const std::string schedule : {"1f1b", "interleaved_1f1b", "zbv"}) {
    for (bool static_shapes : {false, true}) {
      SCOPED_TRACE(absl::StrCat(schedule, static_shapes ? " static shapes" : " dynamic shapes"));
      RunConfig c;
      c.schedule = schedule;
      c.pp = 2;
      c.chunks = schedule == "1f1b" ? 1 : 2;
      c.optimizer.lr = 0.1;
      c.p2p_static_shapes = static_shapes;
      absl::StatusOr<RunResult> plain = TrainPipeline(c);
      ASSERT_TRUE(plain.ok()) << plain.status();
      EXPECT_EQ(plain->received_posted_ahead, 0);
      c.post_receives_ahead = true;
      absl::StatusOr<RunResult> ahead = TrainPipeline(c);
      ASSERT_TRUE(ahead.ok()) << ahead.status();
      // Every step's receives (3 steps x 4 micro-batches, both directions)
      // went through posted receives.
      EXPECT_GE(ahead->received_posted_ahead, 3 * 4 * 2);
      EXPECT_EQ(CompareResults(*plain, *ahead, 0.0), "");
      absl::StatusOr<RunResult> sequential = TrainSequential(c);
      ASSERT_TRUE(sequential.ok()) << sequential.status();
      EXPECT_EQ(CompareResults(*sequential, *ahead, kRtol), "");
    }
  }
}

// Teeth: with the tied-gradient all-reduce disabled, the embedding and the
// head (on different stages) diverge from the sequential model, and the test
// above would fail.
TEST(EquivalenceExtraTest, DetectsMissingTiedGradientReduction) {
  RunConfig c;
  c.schedule = "1f1b";
  c.pp = 2;
  c.optimizer.lr = 0.1;
  c.reduce_tied_grads = false;
  absl::StatusOr<RunResult> pipeline = TrainPipeline(c);
  absl::StatusOr<RunResult> sequential = TrainSequential(c);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  // Either the run notices the tied copies differ, or the comparison does.
  if (pipeline.ok()) {
    EXPECT_NE(CompareResults(*sequential, *pipeline, kRtol), "");
  } else {
    EXPECT_NE(std::string(pipeline.status().message()).find("tied copies"), std::string::npos)
        << pipeline.status();
  }
}

// bf16 keeps the tied reduction's teeth: without it the bf16 pipeline is
// outside the bf16 tolerance too.
TEST(EquivalenceExtraTest, Bf16DetectsMissingTiedGradientReduction) {
  RunConfig c;
  c.schedule = "1f1b";
  c.pp = 2;
  c.optimizer.lr = 0.1;
  c.precision = Precision::kBf16;
  absl::StatusOr<RunResult> sequential = TrainSequential(c);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  absl::StatusOr<RunResult> with = TrainPipeline(c);
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(CompareResults(*sequential, *with, kBf16Rtol, kBf16Atol), "");
  c.reduce_tied_grads = false;
  absl::StatusOr<RunResult> without = TrainPipeline(c);
  if (without.ok()) {
    EXPECT_NE(CompareResults(*sequential, *without, kBf16Rtol, kBf16Atol), "");
  } else {
    EXPECT_NE(std::string(without.status().message()).find("tied copies"), std::string::npos)
        << without.status();
  }
}

// bf16 activations and input gradients cross stages at half the bytes of
// fp32 (same messages, two bytes per element instead of four).
TEST(EquivalenceExtraTest, Bf16HalvesP2PPayloadBytes) {
  for (const std::string schedule : {"1f1b", "zbv"}) {
    SCOPED_TRACE(schedule);
    RunConfig c;
    c.schedule = schedule;
    c.pp = 2;
    c.chunks = schedule == "1f1b" ? 1 : 2;
    c.steps = 1;
    c.optimizer.lr = 0.1;
    absl::StatusOr<RunResult> fp32 = TrainPipeline(c);
    ASSERT_TRUE(fp32.ok()) << fp32.status();
    c.precision = Precision::kBf16;
    absl::StatusOr<RunResult> bf16 = TrainPipeline(c);
    ASSERT_TRUE(bf16.ok()) << bf16.status();
    ASSERT_GT(fp32->payload_bytes_sent, 0);
    EXPECT_EQ(2 * bf16->payload_bytes_sent, fp32->payload_bytes_sent);
  }
}

}  // namespace
}  // namespace testing_runtime
}  // namespace pp
