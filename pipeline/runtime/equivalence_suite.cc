#include "pipeline/runtime/equivalence_suite.h"

#include <cctype>
#include <set>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "pipeline/runtime/stage_executor.h"
#include "pipeline/schedule/ir/capabilities.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/schedules/registry.h"
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
LayerRunner CheckpointEveryBlockOrFail() {
  absl::StatusOr<LayerRunner> runner = CheckpointEveryBlock();
  if (!runner.ok()) {
    ADD_FAILURE() << runner.status();
    return LayerRunner();
  }
  return *runner;
}

RunConfig MakeCase(const std::string& schedule, int pp, int dp, int m, int chunks,
                   const std::string& opt, bool ckpt) {
  RunConfig c;
  c.schedule = schedule;
  c.pp = pp;
  c.dp = dp;
  c.microbatches = m;
  c.chunks = chunks;
  c.layer_runner = ckpt ? CheckpointEveryBlockOrFail() : LayerRunner();
  SetOptimizer(opt, c);
  return c;
}

// A valid gtest name, e.g. "1f1b_pp2_dp1_v1_m3_sgd_ckpt_bf16".
std::string CaseName(const std::string& schedule, int pp, int dp, int chunks, int m,
                     const std::string& opt, bool ckpt, const std::string& suffix) {
  std::string name = absl::StrCat(schedule, "_pp", pp, "_dp", dp, "_v", chunks, "_m", m, "_", opt,
                                  ckpt ? "_ckpt" : "", suffix);
  for (char& ch : name) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

}  // namespace

// Where a bf16 pipeline runs exactly the reference's operations in the same
// order: one stage holding one chunk (the tied embedding and head in one
// autograd graph, as in ToSequential()) and one replica (no data-parallel
// sum). Each micro-batch's backward then rounds the same bf16 values and
// adds them into the fp32 buffers in the same order.
bool Bf16IsBitwise(const RunConfig& c) { return c.pp == 1 && c.dp == 1 && c.chunks == 1; }

std::vector<EquivalenceCase> RegisteredEquivalenceCases() {
  std::vector<EquivalenceCase> cases;
  for (const ScheduleInfo& info : RegisteredSchedules()) {
    for (int pp : {1, 2, 4}) {
      const std::set<int> counts = {1, pp - 1, pp, 2 * pp + 1};
      for (int dp : {1, 2}) {
        int count_index = 0;
        for (int m : counts) {
          if (m < 1) continue;
          // The optimizer and checkpointing as a covering set rather than
          // their product: two of the four pairs per count, the other two at
          // the next, so each (schedule, pp, dp) meets all four pairs (every
          // shape has at least two counts) and every count meets each value.
          const bool sgd_checkpointed = count_index++ % 2 == 1;
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
            const bool ckpt = (opt == "sgd") == sgd_checkpointed;
            RunConfig c = MakeCase(info.name, pp, dp, m, chunks, opt, ckpt);
            cases.push_back(EquivalenceCase{
                c, CaseName(info.name, pp, dp, chunks, m, opt, ckpt, ""), supported});
          }
          // bf16 (mixed_precision.h) against the bf16 sequential reference,
          // once per schedule shape: AdamW, the largest micro-batch count,
          // checkpointing off / on.
          if (m == *counts.rbegin()) {
            for (int ckpt : {0, 1}) {
              RunConfig c = MakeCase(info.name, pp, dp, m, chunks, "adamw", ckpt > 0);
              c.precision = Precision::kBf16;
              cases.push_back(EquivalenceCase{
                  c, CaseName(info.name, pp, dp, chunks, m, "adamw", ckpt > 0, "_bf16"),
                  supported});
            }
          }
          // The distributed optimizer (ZeRO-1, distributed_optimizer.h),
          // once per schedule and pp, a covering set rather than the
          // product: dp = 2 AdamW with 100-element buckets (parameters
          // straddle buckets) and clipping, dp = 4 SGD with momentum and
          // the default bucket under checkpointing, dp = 2 bf16 AdamW. Each
          // against the sequential reference, which the pipeline without it
          // also matches.
          if (m == *counts.rbegin() && dp == 1) {
            for (int zero_dp : {2, 4}) {
              const bool adamw = zero_dp == 2;
              RunConfig c =
                  MakeCase(info.name, pp, zero_dp, m, chunks, adamw ? "adamw" : "sgd", !adamw);
              c.distributed_optimizer = true;
              if (adamw) {
                c.bucket_numel = 100;
                c.max_grad_norm = 0.05;
              }
              cases.push_back(EquivalenceCase{c,
                                              CaseName(info.name, pp, zero_dp, chunks, m,
                                                       adamw ? "adamw" : "sgd", !adamw, "_zero1"),
                                              supported});
            }
            RunConfig c = MakeCase(info.name, pp, 2, m, chunks, "adamw", false);
            c.distributed_optimizer = true;
            c.precision = Precision::kBf16;
            cases.push_back(EquivalenceCase{
                c, CaseName(info.name, pp, 2, chunks, m, "adamw", false, "_zero1_bf16"),
                supported});
            // On GPUs at pp = 2, dp = 2: NCCL's reduce-scatter and all-gather
            // (4 GPUs), and every rank on one GPU (the host-staged backend's
            // all-reduce fallback).
            if (pp == 2) {
              RunConfig g = MakeCase(info.name, pp, 2, m, chunks, "adamw", false);
              g.distributed_optimizer = true;
              g.bucket_numel = 100;
              g.device = DeviceKind::kCuda;
              cases.push_back(EquivalenceCase{
                  g, CaseName(info.name, pp, 2, chunks, m, "adamw", false, "_zero1_cuda"),
                  supported});
              g.ranks_per_device = pp * 2;
              cases.push_back(EquivalenceCase{
                  g, CaseName(info.name, pp, 2, chunks, m, "adamw", false, "_zero1_cuda_shared"),
                  supported});
            }
          }
          // Variable shapes with per-token loss (VarlenToySource: rows and
          // length drawn per micro-batch, a loss mask), once per schedule at
          // pp 2 and 4, a covering set: dp 1 AdamW with checkpointing, dp 2
          // SGD, and at dp 2 bf16 AdamW (pp 2) or the distributed optimizer
          // (pp 4); each with its own seed.
          if (m == *counts.rbegin() && pp > 1) {
            const uint64_t seed = 101 + 10 * pp + dp;
            RunConfig c =
                MakeCase(info.name, pp, dp, m, chunks, dp == 1 ? "adamw" : "sgd", dp == 1);
            c.varlen_seed = seed;
            cases.push_back(EquivalenceCase{
                c, CaseName(info.name, pp, dp, chunks, m, c.optimizer.name, dp == 1, "_varlen"),
                supported});
            if (dp == 2) {
              RunConfig v = MakeCase(info.name, pp, dp, m, chunks, "adamw", false);
              v.varlen_seed = seed + 1000;
              if (pp == 2) {
                v.precision = Precision::kBf16;
              } else {
                v.distributed_optimizer = true;
                v.bucket_numel = 100;
              }
              cases.push_back(EquivalenceCase{v,
                                              CaseName(info.name, pp, dp, chunks, m, "adamw", false,
                                                       pp == 2 ? "_varlen_bf16" : "_varlen_zero1"),
                                              supported});
            }
          }
          // The same on GPUs (rank r on cuda:r, NCCL), once per schedule
          // shape: AdamW, with and without checkpointing, m = the largest
          // count. They skip where pp * dp GPUs are not visible; the
          // "_cuda_shared" twins need one.
          if (m != *counts.rbegin()) continue;
          for (int ckpt : {0, 1}) {
            RunConfig c = MakeCase(info.name, pp, dp, m, chunks, "adamw", ckpt > 0);
            c.device = DeviceKind::kCuda;
            cases.push_back(EquivalenceCase{
                c, CaseName(info.name, pp, dp, chunks, m, "adamw", ckpt > 0, "_cuda"), supported});
            // Every rank on one GPU (parallelism.ranks_per_device = pp * dp:
            // host-staged groups), so one GPU runs every shape.
            if (pp * dp == 1) continue;
            c.ranks_per_device = pp * dp;
            cases.push_back(EquivalenceCase{
                c, CaseName(info.name, pp, dp, chunks, m, "adamw", ckpt > 0, "_cuda_shared"),
                supported});
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
  if (absl::StatusOr<c10::Device> device =
          TestDevice(c.config.device, c.config.pp * c.config.dp, c.config.ranks_per_device);
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
  if (c.config.precision == Precision::kBf16) {
    if (!Bf16IsBitwise(c.config)) {
      EXPECT_EQ(CompareResults(*sequential, *pipeline, kBf16Rtol, kBf16Atol), "");
      return;
    }
    // Losses and weights bit for bit; the grad norm is only computed
    // differently (GlobalGradNorm's fp32 squares vs the reference's double
    // sum), so it matches to fp32 round-off.
    RunResult same_norms = *pipeline;
    same_norms.grad_norms = sequential->grad_norms;
    EXPECT_EQ(CompareResults(*sequential, same_norms, 0.0, 0.0), "");
    EXPECT_EQ(CompareResults(*sequential, *pipeline, kRtol), "");
    return;
  }
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
