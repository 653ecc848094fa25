#include "pipeline/runtime/action_observer.h"

#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "pipeline/runtime/action_log.h"
#include "pipeline/runtime/action_timer.h"
#include "pipeline/runtime/stage_executor.h"
#include "pipeline/schedule/schedules/registry.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

using std::chrono::milliseconds;
using StageFn = std::function<Activations(const Activations&, const MicroBatch&)>;

class OnesSource : public MicroBatchSource {
 public:
  explicit OnesSource(torch::Device device = torch::kCPU) : device_(device) {}
  absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override {
    MicroBatchData d;
    d.inputs = {torch::ones({64, 64}, torch::TensorOptions().device(device_))};
    d.batch.id = step * 100 + index;
    d.batch.tensors["labels"] = torch::zeros({64, 64}, torch::TensorOptions().device(device_));
    return d;
  }

 private:
  torch::Device device_;
};

torch::Tensor Mse(const Activations& out, const MicroBatch& batch) {
  return torch::mse_loss(out[0], batch.Get("labels"));
}

// Writes every call as a word, e.g. "start(0) 0F0( )0F0 end(0:OK)".
class Recorder : public ActionObserver {
 public:
  explicit Recorder(std::string name = "") : name_(std::move(name)) {}
  void StepStart(const ObservedStep& step) override {
    calls.push_back(absl::StrCat(name_, "start(", step.step, ")"));
  }
  void ActionStart(const ObservedStep& step, const Action& a) override {
    calls.push_back(absl::StrCat(name_, ActionToString(a), "("));
  }
  void ActionEnd(const ObservedStep& step, const Action& a) override {
    calls.push_back(absl::StrCat(name_, ")", ActionToString(a)));
  }
  absl::Status StepEnd(const ObservedStep& step, const absl::Status& status) override {
    calls.push_back(absl::StrCat(name_, "end(", step.step, ":", status.ok() ? "OK" : "error", ")"));
    return end_status;
  }
  std::string Calls() const {
    std::string s;
    for (const std::string& c : calls) absl::StrAppend(&s, s.empty() ? "" : " ", c);
    return s;
  }

  std::vector<std::string> calls;
  absl::Status end_status;

 private:
  std::string name_;
};

LoweredProgram OneRankProgram(std::vector<Action> actions, int m) {
  LoweredProgram p;
  p.schedule_name = "test";
  p.num_stages = 1;
  p.num_microbatches = m;
  p.stage_to_rank = {0};
  p.ranks = {std::move(actions)};
  return p;
}

StageExecutor OneStage(torch::nn::Linear& linear, MicroBatchSource* source) {
  std::map<int, StageFn> stages = {
      {0, [&](const Activations& in, const MicroBatch&) { return Activations{linear(in[0])}; }}};
  return StageExecutor(0, stages, Mse, source, c10::intrusive_ptr<c10d::ProcessGroup>(),
                       StageExecutorOptions{});
}

// The executor tells its observer about the step and every executed action
// (an OVERLAP_F_B's halves one by one), in program order.
TEST(ActionObserverTest, SeesEveryActionInOrder) {
  torch::nn::Linear linear(64, 64);
  OnesSource source;
  StageExecutor exec = OneStage(linear, &source);
  Recorder recorder;
  exec.set_observer(&recorder);
  absl::StatusOr<StepStats> r =
      exec.Run(OneRankProgram({F(0, 0), OverlapFB(F(0, 1), B(0, 0)), B(0, 1)}, 2), 7, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(recorder.Calls(), "start(7) 0F0( )0F0 0F1( )0F1 0B0( )0B0 0B1( )0B1 end(7:OK)");
  // Removed, it sees nothing more.
  exec.set_observer(nullptr);
  ASSERT_TRUE(exec.Run(OneRankProgram({F(0, 0), B(0, 0)}, 1), 8, nullptr).ok());
  EXPECT_EQ(recorder.calls.size(), 10u);
}

// A failing action gets no end; the step's end carries the error, and an
// observer's own StepEnd error fails a step that had succeeded.
TEST(ActionObserverTest, FailuresReachTheObserverAndBack) {
  torch::nn::Linear linear(64, 64);
  OnesSource source;
  StageExecutor exec = OneStage(linear, &source);
  Recorder recorder;
  exec.set_observer(&recorder);
  absl::StatusOr<StepStats> r = exec.Run(OneRankProgram({F(0, 0), W(0, 0)}, 1), 0, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(recorder.Calls(), "start(0) 0F0( )0F0 0W0( end(0:error)");

  recorder.calls.clear();
  recorder.end_status = absl::DeadlineExceededError("device did not finish");
  r = exec.Run(OneRankProgram({F(0, 0), B(0, 0)}, 1), 1, nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
}

// ActionObservers nests its observers like scopes: starts in order, ends in
// reverse; null entries are skipped.
TEST(ActionObserverTest, ObserversNest) {
  torch::nn::Linear linear(64, 64);
  OnesSource source;
  StageExecutor exec = OneStage(linear, &source);
  std::vector<std::string> calls;
  Recorder outer("a:"), inner("b:");
  ActionObservers both({&outer, nullptr, &inner});
  EXPECT_FALSE(both.empty());
  EXPECT_TRUE(ActionObservers({nullptr}).empty());
  exec.set_observer(&both);
  ASSERT_TRUE(exec.Run(OneRankProgram({F(0, 0), B(0, 0)}, 1), 0, nullptr).ok());
  EXPECT_EQ(outer.Calls(), "a:start(0) a:0F0( a:)0F0 a:0B0( a:)0B0 a:end(0:OK)");
  EXPECT_EQ(inner.Calls(), "b:start(0) b:0F0( b:)0F0 b:0B0( b:)0B0 b:end(0:OK)");
}

// The timer gives each executed action an interval inside the step's, in
// program order; busy time is that of compute actions only.
TEST(ActionTimerTest, TimesEveryActionOfTwoRanks) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [&](World& world) -> absl::Status {
    ScheduleOptions o;
    o.num_stages = 2;
    o.num_microbatches = 4;
    PP_ASSIGN_OR_RETURN(Schedule schedule, MakeSchedule("1f1b", o));
    PP_ASSIGN_OR_RETURN(LoweredProgram program, Lower(schedule));
    torch::nn::Linear linear(64, 64);
    OnesSource source;
    std::map<int, StageFn> stages = {{world.rank, [&](const Activations& in, const MicroBatch&) {
                                        return Activations{linear(in[0])};
                                      }}};
    StageExecutorOptions eo;
    eo.defer_receives = false;  // the timings then follow the lowered program
    StageExecutor exec(world.rank, stages, Mse, &source, world.group, eo);
    ActionTimer timer(torch::kCPU, milliseconds(5000));
    ActionLog log;  // --v=1 is off: it logs nothing, but runs beside the timer
    ActionObservers observers({&log, &timer});
    exec.set_observer(&observers);
    PP_RETURN_IF_ERROR(exec.Run(program, 3, nullptr).status());
    std::vector<Action> timed;
    int64_t compute_us = 0;
    int64_t last_end = 0;
    for (const ActionTiming& t : timer.timings()) {
      if (t.end_us < t.start_us || t.start_us < last_end) {
        return absl::InternalError(absl::StrCat(ActionToString(t.action), " has interval [",
                                                t.start_us, ", ", t.end_us, "] after ", last_end));
      }
      last_end = t.end_us;
      if (IsCompute(t.action.type)) compute_us += t.end_us - t.start_us;
      timed.push_back(t.action);
    }
    if (ActionsToString(timed) != ActionsToString(program.ranks[world.rank])) {
      return absl::InternalError(absl::StrCat("timed ", ActionsToString(timed), " but ran ",
                                              ActionsToString(program.ranks[world.rank])));
    }
    if (timer.busy_us() != compute_us || timer.busy_us() <= 0 ||
        timer.wall_us() < timer.busy_us()) {
      return absl::InternalError(absl::StrCat("busy ", timer.busy_us(), " us, compute ", compute_us,
                                              " us, wall ", timer.wall_us(), " us"));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// On a GPU the timer reads device events: a forward of large matmuls takes
// device time the host does not wait for, so the timed F covers the kernels
// (a host-clock timer without a device wait would time only the launches).
TEST(ActionTimerTest, DeviceEventsTimeTheKernels_cuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU visible";
  const torch::Device cuda(torch::kCUDA, 0);
  torch::nn::Linear linear(4096, 4096);
  linear->to(cuda);
  class BigSource : public MicroBatchSource {
   public:
    absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override {
      MicroBatchData d;
      const auto on = torch::TensorOptions().device(torch::kCUDA, 0);
      d.inputs = {torch::ones({4096, 4096}, on)};
      d.batch.id = step * 100 + index;
      d.batch.tensors["labels"] = torch::zeros({4096, 4096}, on);
      return d;
    }
  } source;
  std::map<int, StageFn> stages = {{0, [&](const Activations& in, const MicroBatch&) {
                                      torch::Tensor x = in[0];
                                      for (int i = 0; i < 20; ++i) x = torch::tanh(linear(x));
                                      return Activations{x};
                                    }}};
  StageExecutorOptions eo;
  eo.p2p.device = cuda;
  StageExecutor exec(0, stages, Mse, &source, c10::intrusive_ptr<c10d::ProcessGroup>(), eo);
  ActionTimer timer(cuda, milliseconds(60000));
  exec.set_observer(&timer);
  for (int step = 0; step < 2; ++step) {  // the first warms up cuBLAS
    absl::StatusOr<StepStats> r = exec.Run(OneRankProgram({F(0, 0), B(0, 0)}, 1), step, nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  ASSERT_EQ(timer.timings().size(), 2u);
  // 20 matmuls of 4096^3 (2.7 TFLOP in all) take well over 0.1 ms on any GPU.
  const ActionTiming& f = timer.timings()[0];
  EXPECT_GT(f.end_us - f.start_us, 100) << "the forward's kernels were not timed";
  EXPECT_GE(timer.wall_us(), timer.busy_us());
}

}  // namespace
}  // namespace pp
