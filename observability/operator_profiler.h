// Operator profiles of training steps N..M on one rank, with LibTorch's
// profiler, written as that rank's Chrome trace; trace_merge.h combines the
// ranks' traces with pipe's action trace.
//
//   PP_ASSIGN_OR_RETURN(StepRange steps, ParseStepRange("10:12"));   // --profile_steps
//   PP_ASSIGN_OR_RETURN(auto profiler, OperatorProfiler::Create({steps, rank}));
//   for each step:  profiler->BeginStep(step); ...step...; profiler->EndStep(step);
//   if (profiler->finished()) profiler->WriteChromeTrace(dir + "/profile_rank_0.json");
//
// How: a process-wide recorder on ATen's RecordFunction (at::addGlobalCallback),
// the hook LibTorch's own profiler is built on, with the same API in 1.13 and
// 2.x. LibTorch's profiler itself cannot serve ranks run as threads: Debian's
// 1.13 has no Kineto (its Kineto-style API records only the enabling thread),
// and 2.x's Kineto is one session per *process* (a second thread's
// enable/disable fails: "Can't disable Kineto profiler when it's not running",
// or crashes in Kineto's init). Here every profiler that is recording
// registers the thread that runs its steps; one global callback (registered
// while any profiler records) stamps each operator with steady_clock and hands
// it to the profiler of the thread that ran it, or, for an autograd node run on
// another thread (a device's backward thread), of the thread that ran its
// forward. So profilers of different threads (ranks) overlap freely and each
// sees only its own operators, on both LibTorch versions.
//
// Clock: events are stamped with steady_clock microseconds when the operator
// starts and ends (the clock of pipe's action timings), no conversion needed.
// Device kernels (CUDA) are not recorded: this is the CPU operator timeline.
#ifndef OBSERVABILITY_OPERATOR_PROFILER_H_
#define OBSERVABILITY_OPERATOR_PROFILER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pp {

// Training steps first..last, both included.
struct StepRange {
  int64_t first = 0;
  int64_t last = 0;
  bool Contains(int64_t step) const { return step >= first && step <= last; }
};

// "N:M" (steps N to M) or "N" (step N alone). InvalidArgument naming the spec
// for anything else, a negative step, or M < N.
absl::StatusOr<StepRange> ParseStepRange(absl::string_view spec);

// One recorded operator (or autograd node, or user scope).
struct OperatorEvent {
  std::string name;      // "aten::addmm", "AddmmBackward0", a RECORD_USER_SCOPE name
  std::string category;  // "cpu_op", "backward", "user_annotation", "other"
  int64_t start_us = 0;  // steady_clock microseconds
  int64_t duration_us = 0;
  uint64_t thread = 0;  // LibTorch's thread id (at::RecordFunction::currentThreadId)
  std::vector<std::vector<int64_t>> input_shapes;  // with record_shapes only
};

namespace operator_profiler_internal {
struct Sink;  // operator_profiler.cc
}  // namespace operator_profiler_internal

// Steady-clock interval of one profiled step on the thread that ran it.
struct StepSpan {
  int64_t step = 0;
  int64_t start_us = 0;
  int64_t end_us = 0;
  uint64_t thread = 0;
};

struct OperatorProfilerOptions {
  StepRange steps;
  int rank = 0;
  // Record each operator's input shapes (costs time per operator).
  bool record_shapes = false;
};

// Profiles one rank's steps: the operators run by the thread that calls
// BeginStep/EndStep (and autograd nodes whose forward ran there). BeginStep and
// EndStep must come from that thread; not thread-safe otherwise. Any number of
// profilers may record at once on different threads (ranks run as threads
// each get their own); one per thread at a time.
class OperatorProfiler {
 public:
  static absl::StatusOr<std::unique_ptr<OperatorProfiler>> Create(
      const OperatorProfilerOptions& options);
  OperatorProfiler(const OperatorProfiler&) = delete;
  OperatorProfiler& operator=(const OperatorProfiler&) = delete;
  // Stops a profile still running, dropping it.
  ~OperatorProfiler();

  // Call right before step `step`; starts the profiler at the range's first
  // step (or the first step inside the range the loop reaches), and stops it,
  // keeping the profile, if the loop jumped past the range's end. FailedPrecondition if the
  // previous step was not ended, if called on another thread than the first call, after the
  // profile finished for a step in the range, or if another profiler is recording this thread.
  absl::Status BeginStep(int64_t step);
  // Call right after step `step`; after the range's last step, stops the
  // profiler and collects the events. FailedPrecondition if `step` was not begun.
  absl::Status EndStep(int64_t step);
  // Stops early (e.g. the run ended before the range's last step), keeping what
  // was recorded. No-op unless recording.
  absl::Status Stop();

  bool recording() const { return recording_; }
  bool finished() const { return finished_; }
  const OperatorProfilerOptions& options() const { return options_; }

  // After the profile finished: the events in start order (parents before
  // children), and each profiled step's span.
  const std::vector<OperatorEvent>& events() const { return events_; }
  const std::vector<StepSpan>& steps() const { return steps_; }

  // The rank's Chrome trace: one complete event per operator (pid = rank,
  // tid = LibTorch thread), "ProfilerStep#N" spans around each step's
  // operators, timestamps in steady_clock microseconds, and
  // otherData {rank, clock: "steady_clock_us", steps: [first, last]} for
  // trace_merge.h. FailedPrecondition before the profile finished.
  absl::StatusOr<std::string> ChromeTraceJson() const;
  // Writes ChromeTraceJson to `path`; Internal if it cannot be written.
  absl::Status WriteChromeTrace(absl::string_view path) const;

 private:
  explicit OperatorProfiler(const OperatorProfilerOptions& options) : options_(options) {}
  absl::Status Start();
  absl::Status Collect();

  const OperatorProfilerOptions options_;
  std::thread::id owner_;
  bool owner_known_ = false;
  bool recording_ = false;
  bool finished_ = false;
  bool in_step_ = false;
  int64_t current_step_ = -1;
  std::shared_ptr<operator_profiler_internal::Sink>
      sink_;  // while recording: where the global callback puts events
  std::vector<OperatorEvent> events_;
  std::vector<StepSpan> steps_;
};

}  // namespace pp

#endif  // OBSERVABILITY_OPERATOR_PROFILER_H_
