// Tensor parallelism in the equivalence proof: pipe x tensor x data trains
// the toy model split for tensor parallelism (ToyParallelSpecs: vocabulary-
// parallel tied embedding and head with a padded vocabulary, column- and
// row-parallel blocks) to the losses, grad norms and final weights of the
// same model trained dense by ToSequential().
//
// Covering set, not the full product (CI time): the four (pp, tp, dp) shapes
// (1,2,1), (2,2,1), (2,2,2), (4,2,1) take the registered training schedules in
// turn, so every schedule runs once at tp = 2 and every shape runs several
// schedules; activation checkpointing alternates between rounds, so every
// shape runs with and without it. AdamW with weight decay throughout (the
// padding rows of the vocabulary must stay zero). Besides: clipping by the
// global norm at tp = 2 (a replicated parameter counted once, a sharded one
// once per shard), the distributed optimizer at (2,2,2), variable shapes with per-token loss,
// bf16's first step, and the planted faults:
// a missing all-reduce and a wrong slice in the communication functions must each fail the
// comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipeline/runtime/equivalence_testing.h"
#include "pipeline/schedule/schedules/registry.h"
#include "pipeline/tensor_parallel/planted_fault.h"

namespace pp {
namespace testing_runtime {
namespace {

namespace tp_internal = tensor_parallel::internal;

constexpr double kRtol = 1e-5;

struct Shape {
  int pp, tp, dp;
};
constexpr Shape kShapes[] = {{1, 2, 1}, {2, 2, 1}, {2, 2, 2}, {4, 2, 1}};

RunConfig ToyParallel(const std::string& schedule, const Shape& shape) {
  RunConfig c;
  c.schedule = schedule;
  c.pp = shape.pp;
  c.tp = shape.tp;
  c.dp = shape.dp;
  // 8 layers: interleaved schedules at pp 4 place two chunks per rank.
  c.specs = [] { return ToyParallelSpecs(6); };
  c.parallel_loss = ToyParallelLoss;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 0.01;
  c.optimizer.weight_decay = 0.01;
  return c;
}

// Chunks and micro-batches the schedule takes at `pp` (two chunks where it
// takes them; the first count of 2p + 1, p, 1 it accepts); false if none.
bool FitSchedule(RunConfig& c) {
  for (int m : {2 * c.pp + 1, c.pp, 1}) {
    for (int chunks : {2, 1}) {
      absl::StatusOr<Schedule> s = MakeSchedule(c.schedule, {c.pp, m, chunks, 0});
      if (s.ok() && !s->forward_only) {
        c.microbatches = m;
        c.chunks = chunks;
        return true;
      }
    }
  }
  return false;
}

struct Case {
  RunConfig config;
  std::string name;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> CoveringCases() {
  std::vector<Case> cases;
  int turn = 0;
  int visits[4] = {0, 0, 0, 0};  // cases per shape so far
  for (const ScheduleInfo& info : RegisteredSchedules()) {
    // The schedule's turn's shape, or the next one it fits (a schedule that
    // needs two stages skips pp = 1).
    for (int tries = 0; tries < 4; ++tries, ++turn) {
      const Shape& shape = kShapes[turn % 4];
      RunConfig c = ToyParallel(info.name, shape);
      if (!FitSchedule(c)) continue;
      // Every other case of a shape checkpoints.
      const bool ckpt = visits[turn % 4]++ % 2 == 1;
      if (ckpt) {
        absl::StatusOr<LayerRunner> runner = CheckpointEveryBlock();
        EXPECT_TRUE(runner.ok()) << runner.status();
        if (runner.ok()) c.layer_runner = *runner;
      }
      std::string name = absl::StrCat(info.name, "_pp", c.pp, "_tp", c.tp, "_dp", c.dp, "_v",
                                      c.chunks, "_m", c.microbatches, ckpt ? "_ckpt" : "");
      for (char& ch : name) {
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      cases.push_back({c, name});
      ++turn;
      break;
    }
  }
  return cases;
}

class TensorParallelEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelEquivalence, PipelineEqualsSequential) {
  const RunConfig& c = GetParam().config;
  absl::StatusOr<RunResult> pipeline = TrainPipeline(c);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  absl::StatusOr<RunResult> sequential = TrainSequential(c);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  EXPECT_EQ(CompareResults(*sequential, *pipeline, kRtol), "");
}

INSTANTIATE_TEST_SUITE_P(Registry, TensorParallelEquivalence, ::testing::ValuesIn(CoveringCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

TEST(TensorParallelCoverage, EveryShapeAndScheduleRuns) {
  const std::vector<Case> cases = CoveringCases();
  std::set<std::string> schedules;
  std::set<std::string> shapes;
  for (const Case& c : cases) {
    schedules.insert(c.config.schedule);
    shapes.insert(absl::StrCat(c.config.pp, "x", c.config.tp, "x", c.config.dp,
                               c.config.layer_runner ? "ckpt" : ""));
  }
  int training = 0;
  for (const ScheduleInfo& info : RegisteredSchedules()) {
    if (absl::StatusOr<Schedule> s = MakeSchedule(info.name, {2, 5, 1, 0});
        s.ok() && s->forward_only)
      continue;
    ++training;
  }
  EXPECT_GE(static_cast<int>(schedules.size()), training);
  // Each shape with and without checkpointing.
  EXPECT_EQ(shapes.size(), 8u) << absl::StrJoin(shapes, ", ");
}

// Global-norm clipping at tp = 2: the norm the pipeline clips by must be the
// dense model's (a replicated parameter counted once, not tp times).
TEST(TensorParallelEquivalenceExtra, ClippingMatchesSequential) {
  RunConfig c = ToyParallel("1f1b", {2, 2, 1});
  c.microbatches = 3;
  c.max_grad_norm = 0.05;
  absl::StatusOr<RunResult> pipeline = TrainPipeline(c);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  absl::StatusOr<RunResult> sequential = TrainSequential(c);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  ASSERT_GT(sequential->grad_norms[0], c.max_grad_norm);
  EXPECT_EQ(CompareResults(*sequential, *pipeline, kRtol), "");
}

// The distributed optimizer under tensor parallelism: each tp rank's
// parameters (its shards and its copy of the replicated ones) are sliced
// over its data group; the norm sums the slices over data and pipe x model.
// 1F1B and interleaved 1F1B (two chunks) at pp 2 x tp 2 x dp 2, clipping
// active, checkpointing on the second.
TEST(TensorParallelEquivalenceExtra, DistributedOptimizerMatchesSequential) {
  for (const std::string schedule : {"1f1b", "interleaved_1f1b"}) {
    SCOPED_TRACE(schedule);
    RunConfig c = ToyParallel(schedule, {2, 2, 2});
    c.microbatches = 4;
    c.chunks = schedule == "1f1b" ? 1 : 2;
    c.max_grad_norm = 0.05;
    c.distributed_optimizer = true;
    c.bucket_numel = 64;
    if (schedule != "1f1b") {
      absl::StatusOr<LayerRunner> runner = CheckpointEveryBlock();
      ASSERT_TRUE(runner.ok()) << runner.status();
      c.layer_runner = *runner;
    }
    absl::StatusOr<RunResult> pipeline = TrainPipeline(c);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    absl::StatusOr<RunResult> sequential = TrainSequential(c);
    ASSERT_TRUE(sequential.ok()) << sequential.status();
    ASSERT_GT(sequential->grad_norms[0], c.max_grad_norm);
    EXPECT_EQ(CompareResults(*sequential, *pipeline, kRtol), "");
  }
}

// Variable shapes with per-token loss (VarlenToySource) at tp = 2: ZB-V at
// pp 2 x tp 2 x dp 2 and interleaved 1F1B at pp 4 x tp 2 with
// checkpointing; the vocabulary-parallel loss sums over the mask.
TEST(TensorParallelEquivalenceExtra, VariableShapesMatchSequential) {
  struct VarlenCase {
    std::string schedule;
    Shape shape;
    bool ckpt;
  };
  for (const VarlenCase& v :
       {VarlenCase{"zbv", {2, 2, 2}, false}, VarlenCase{"interleaved_1f1b", {4, 2, 1}, true}}) {
    SCOPED_TRACE(v.schedule);
    RunConfig c = ToyParallel(v.schedule, v.shape);
    c.microbatches = 4;
    c.chunks = 2;
    c.varlen_seed = 31;
    if (v.ckpt) {
      absl::StatusOr<LayerRunner> runner = CheckpointEveryBlock();
      ASSERT_TRUE(runner.ok()) << runner.status();
      c.layer_runner = *runner;
    }
    absl::StatusOr<RunResult> pipeline = TrainPipeline(c);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    absl::StatusOr<RunResult> sequential = TrainSequential(c);
    ASSERT_TRUE(sequential.ok()) << sequential.status();
    EXPECT_EQ(CompareResults(*sequential, *pipeline, kRtol), "");
  }
}

// bf16 (mixed_precision.h) at tp = 2 against the bf16 reference. Not to the
// suite's bf16 bound: a row-parallel layer's output is each rank's partial
// product rounded to bf16 and then summed, where the dense layer rounds the
// whole sum once, so every tensor-parallel block adds a bf16 rounding (2^-9
// relative) the reference does not have. Measured at 6 blocks: the first
// step's loss 6e-4 and grad norm 1.1e-3 relative apart, and after three AdamW
// steps weights up to 0.02 (two learning rates: AdamW turns a gradient's
// rounding into a whole step where it cancels). So the check is the first
// step's loss and grad norm within one bf16 ulp (2^-8) of the reference's,
// and a missing all-reduce under bf16 must fail it.
constexpr double kBf16TpRtol = 1.0 / 256;

std::string CompareFirstStep(const RunResult& want, const RunResult& got) {
  std::string out;
  auto close = [](double a, double b) {
    return std::abs(a - b) <= kBf16TpRtol * std::max(std::abs(a), std::abs(b));
  };
  if (!close(want.losses[0], got.losses[0])) {
    absl::StrAppend(&out, "loss ", got.losses[0], " != ", want.losses[0], "; ");
  }
  if (!close(want.grad_norms[0], got.grad_norms[0])) {
    absl::StrAppend(&out, "grad norm ", got.grad_norms[0], " != ", want.grad_norms[0], "; ");
  }
  return out;
}

TEST(TensorParallelEquivalenceExtra, Bf16FirstStepMatchesSequential) {
  RunConfig c = ToyParallel("1f1b", {2, 2, 1});
  c.microbatches = 3;
  c.steps = 1;
  c.precision = Precision::kBf16;
  absl::StatusOr<RunResult> sequential = TrainSequential(c);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  absl::StatusOr<RunResult> pipeline = TrainPipeline(c);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  EXPECT_EQ(CompareFirstStep(*sequential, *pipeline), "");

  const tp_internal::PlantedFault previous =
      tp_internal::PlantFault(tp_internal::PlantedFault::kSkipAllReduce);
  absl::StatusOr<RunResult> broken = TrainPipeline(c);
  tp_internal::PlantFault(previous);
  if (broken.ok()) EXPECT_NE(CompareFirstStep(*sequential, *broken), "");
}

// The teeth: each planted fault in the communication functions makes the
// comparison fail (or the run refuse), where the same case passes above.
class PlantedFaultTest : public ::testing::TestWithParam<tp_internal::PlantedFault> {};

TEST_P(PlantedFaultTest, FailsTheComparison) {
  RunConfig c = ToyParallel("1f1b", {2, 2, 1});
  c.microbatches = 3;
  absl::StatusOr<RunResult> sequential = TrainSequential(c);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  const tp_internal::PlantedFault previous = tp_internal::PlantFault(GetParam());
  absl::StatusOr<RunResult> pipeline = TrainPipeline(c);
  tp_internal::PlantFault(previous);
  if (pipeline.ok()) {
    EXPECT_NE(CompareResults(*sequential, *pipeline, kRtol), "");
  } else {
    // A fault that breaks the replicas' agreement is caught there.
    EXPECT_EQ(pipeline.status().code(), absl::StatusCode::kInternal) << pipeline.status();
  }
}

INSTANTIATE_TEST_SUITE_P(Faults, PlantedFaultTest,
                         ::testing::Values(tp_internal::PlantedFault::kSkipAllReduce,
                                           tp_internal::PlantedFault::kWrongSlice),
                         [](const ::testing::TestParamInfo<tp_internal::PlantedFault>& info) {
                           return info.param == tp_internal::PlantedFault::kSkipAllReduce
                                      ? std::string("SkipAllReduce")
                                      : std::string("WrongSlice");
                         });

}  // namespace
}  // namespace testing_runtime
}  // namespace pp
