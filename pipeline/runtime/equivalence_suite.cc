#include "pipeline/runtime/equivalence_suite.h"

#include <cctype>
#include <set>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "pipeline/autograd/activation_checkpointing.h"
#include "pipeline/runtime/stage_executor.h"
#include "pipeline/schedule/capabilities.h"
#include "pipeline/schedule/lowering.h"
#include "pipeline/schedule/registry.h"
#include "topology/device.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace testing_runtime {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kCudaRtol = 1e-4;

absl::StatusOr<Schedule> Make(const std::string& name, int pp, int m, int chunks) {
  ScheduleOptions o;
  o.num_stages = pp;
  o.num_microbatches = m;
  o.num_chunks = chunks;
  return MakeSchedule(name, o);
}

void SetOptimizer(const std::string& opt, RunConfig& c) {
  c.optimizer.name = opt;
  if (opt == "sgd") {
    c.optimizer.lr = 0.1;
    c.optimizer.momentum = 0.9;
  } else {
    c.optimizer.lr = 0.01;
    c.optimizer.weight_decay = 0.01;
  }
}

// Activation checkpointing of every toy Block (pipeline/autograd).
LayerRunner CheckpointEveryBlock() {
  ActivationCheckpointPolicy policy;
  policy.interval = 1;
  policy.checkpointable_types = "Block";
  absl::StatusOr<LayerRunner> runner = MakeCheckpointingRunner(policy);
  if (!runner.ok()) {
    ADD_FAILURE() << runner.status();
    return LayerRunner();
  }
  return *runner;
}

}  // namespace

std::vector<EquivalenceCase> RegisteredEquivalenceCases() {
  std::vector<EquivalenceCase> cases;
  for (const ScheduleInfo& info : RegisteredSchedules()) {
    for (int pp : {1, 2, 4}) {
      const std::set<int> counts = {1, pp - 1, pp, 2 * pp + 1};
      for (int dp : {1, 2}) {
        for (int m : counts) {
          if (m < 1) continue;
          // Two chunks where the schedule takes them, else one; a count it
          // rejects either way is not a case (its own validation decides).
          int chunks = 2;
          absl::StatusOr<Schedule> schedule = Make(info.name, pp, m, chunks);
          if (!schedule.ok()) {
            chunks = 1;
            schedule = Make(info.name, pp, m, chunks);
          }
          if (!schedule.ok() || schedule->forward_only) continue;
          bool supported = false;
          if (absl::StatusOr<LoweredProgram> program = Lower(*schedule); program.ok()) {
            supported = CheckRuntimeSupports(*program, StageExecutorCapabilities()).ok();
          }
          for (const std::string opt : {"sgd", "adamw"}) {
            for (int ckpt : {0, 1}) {
              RunConfig c;
              c.schedule = info.name;
              c.pp = pp;
              c.dp = dp;
              c.microbatches = m;
              c.chunks = chunks;
              c.layer_runner = ckpt > 0 ? CheckpointEveryBlock() : LayerRunner();
              SetOptimizer(opt, c);
              std::string name = absl::StrCat(info.name, "_pp", pp, "_dp", dp, "_v", chunks, "_m",
                                              m, "_", opt, ckpt > 0 ? "_ckpt" : "");
              for (char& ch : name) {
                if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
              }
              cases.push_back(EquivalenceCase{c, name, supported});
            }
          }
          // The same on GPUs (rank r on cuda:r, NCCL), once per schedule
          // shape: AdamW, with and without checkpointing, m = the largest
          // count. They skip where pp * dp GPUs are not visible.
          if (m != *counts.rbegin()) continue;
          for (int ckpt : {0, 1}) {
            RunConfig c;
            c.schedule = info.name;
            c.pp = pp;
            c.dp = dp;
            c.microbatches = m;
            c.chunks = chunks;
            c.device = DeviceKind::kCuda;
            c.layer_runner = ckpt > 0 ? CheckpointEveryBlock() : LayerRunner();
            SetOptimizer("adamw", c);
            std::string name = absl::StrCat(info.name, "_pp", pp, "_dp", dp, "_v", chunks, "_m", m,
                                            "_adamw", ckpt > 0 ? "_ckpt" : "", "_cuda");
            for (char& ch : name) {
              if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
            }
            cases.push_back(EquivalenceCase{c, name, supported});
          }
        }
      }
    }
  }
  return cases;
}

namespace {

class EquivalenceSuite : public ::testing::TestWithParam<EquivalenceCase> {};

TEST_P(EquivalenceSuite, PipelineEqualsSequential) {
  const EquivalenceCase& c = GetParam();
  if (absl::StatusOr<c10::Device> device = TestDevice(c.config.device, c.config.pp * c.config.dp);
      !device.ok()) {
    GTEST_SKIP() << device.status().message();
  }
  absl::StatusOr<RunResult> pipeline = TrainPipeline(c.config);
  if (!c.runtime_supports) {
    // Refused clearly rather than run wrongly.
    ASSERT_FALSE(pipeline.ok());
    EXPECT_EQ(pipeline.status().code(), absl::StatusCode::kUnimplemented) << pipeline.status();
    return;
  }
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  absl::StatusOr<RunResult> sequential = TrainSequential(c.config);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  // On a GPU the kernels sum in other orders than the CPU reference.
  EXPECT_EQ(CompareResults(*sequential, *pipeline,
                           c.config.device == DeviceKind::kCpu ? kRtol : kCudaRtol),
            "");
}

INSTANTIATE_TEST_SUITE_P(Registry, EquivalenceSuite,
                         ::testing::ValuesIn(RegisteredEquivalenceCases()),
                         [](const ::testing::TestParamInfo<EquivalenceCase>& info) {
                           return info.param.name;
                         });

// A binary with no training schedule linked would check nothing.
TEST(EquivalenceSuiteTest, HasCases) {
  EXPECT_FALSE(RegisteredEquivalenceCases().empty())
      << "no registered training schedule: link the schedule target into this test";
}

}  // namespace
}  // namespace testing_runtime
}  // namespace pp
