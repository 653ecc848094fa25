// Operator profiles of training steps N..M on one rank, with LibTorch's
// profiler, written as that rank's Chrome trace; trace_merge.h combines the
// ranks' traces with pipe's action trace.
//
//   PP_ASSIGN_OR_RETURN(StepRange steps, ParseStepRange("10:12"));   // --profile_steps
//   PP_ASSIGN_OR_RETURN(auto profiler, OperatorProfiler::Create({steps, rank}));
//   for each step:  profiler->BeginStep(step); ...step...; profiler->EndStep(step);
//   if (profiler->finished()) profiler->WriteChromeTrace(dir + "/profile_rank_0.json");
//
// Which profiler: Debian's LibTorch 1.13 is built without Kineto (no
// libkineto; Python's torch.autograd.kineto_available() is False). Its
// Kineto-style API (torch::autograd::profiler::enableProfiler with
// ProfilerState::KINETO and ActivityType::CPU, then disableProfiler) still
// records every operator through RecordFunction and returns them as
// KinetoEvents; only ProfilerResult::save, Kineto's trace writer, needs
// Kineto (Debian's Python build does not even expose it). The legacy profiler
// (enableProfilerLegacy, RecordProfile) works too but is the deprecated path and stamps times
// relative to its own start. So this uses the Kineto-style API, which LibTorch 2.x keeps with the
// same calls, and writes the Chrome trace itself.
//
// Clock: LibTorch stamps events with its own clock (1.13: CLOCK_REALTIME; 2.x:
// a TSC converted to Unix time). Events are moved onto steady_clock
// microseconds, the clock of pipe's action timings, by an anchor: a user-scope
// event recorded at start between two steady_clock reads.
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

// Profiles one rank's steps. LibTorch's profiler is per thread: BeginStep and
// EndStep must come from the thread that runs the steps (operators on threads
// it starts through at::launch are included). Not thread-safe otherwise. One
// profiler per thread at a time (ranks run as threads each get their own).
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
  // previous step was not ended, if called on another thread than the first call, or after the
  // profile finished for a step in the range; Internal if LibTorch refuses (e.g. a profiler is
  // already running on this thread).
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

  // After the profile finished: the events in start order, the anchor removed,
  // and each profiled step's span.
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
  int64_t anchor_before_us_ = 0;
  int64_t anchor_after_us_ = 0;
  std::vector<OperatorEvent> events_;
  std::vector<StepSpan> steps_;
};

// The name of the anchor event (never in events()).
inline constexpr char kProfilerAnchorName[] = "pp::profiler_clock_anchor";

}  // namespace pp

#endif  // OBSERVABILITY_OPERATOR_PROFILER_H_
