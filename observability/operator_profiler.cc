#include "observability/operator_profiler.h"

// LibTorch's libraries are built with NDEBUG, and at::RecordFunction has a
// member (inputs_valid_) only without it; inputs() reads that member in a
// debug-only assert. Compiled without NDEBUG (Bazel's fastbuild) the inline
// inputs() would read a byte LibTorch never writes and assert at random. So
// this file sees the header, and everything it pulls in, as LibTorch does.
// It must come before any other LibTorch header.
#ifndef NDEBUG
#define NDEBUG
#define PP_OPERATOR_PROFILER_DEFINED_NDEBUG
#endif
#include <ATen/record_function.h>
#ifdef PP_OPERATOR_PROFILER_DEFINED_NDEBUG
#undef NDEBUG
#undef PP_OPERATOR_PROFILER_DEFINED_NDEBUG
#endif

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <unordered_map>
#include <utility>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"

namespace pp {
namespace operator_profiler_internal {

// Where the global callback puts the events of one recording profiler.
struct Sink {
  uint64_t thread = 0;  // at::RecordFunction::currentThreadId() of the owner
  int rank = 0;
  bool record_shapes = false;
  absl::Mutex mu;
  bool open ABSL_GUARDED_BY(mu) = true;
  std::vector<OperatorEvent> events ABSL_GUARDED_BY(mu);
};

}  // namespace operator_profiler_internal

namespace {

using operator_profiler_internal::Sink;

int64_t SteadyMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Category(at::RecordScope scope) {
  switch (scope) {
    case at::RecordScope::FUNCTION:
      return "cpu_op";
    case at::RecordScope::BACKWARD_FUNCTION:
      return "backward";
    case at::RecordScope::USER_SCOPE:
      return "user_annotation";
    default:
      return "other";
  }
}

absl::Status NotOwner(absl::string_view call) {
  return absl::FailedPreconditionError(
      absl::StrCat("OperatorProfiler::", call,
                   " called from another thread than its first call: the profiler records the "
                   "thread that runs the steps"));
}

// The process-wide side: recording profilers by owner thread, and the global
// RecordFunction callbacks (one that copies inputs for profilers recording
// shapes, one that does not), each registered while a profiler needs it.
class Recorder {
 public:
  static Recorder& Get() {
    static Recorder* recorder = new Recorder;  // never destroyed: callbacks may run at exit
    return *recorder;
  }

  absl::Status Add(const std::shared_ptr<Sink>& sink) {
    absl::MutexLock lock(&mu_);
    auto [it, added] = sinks_.emplace(sink->thread, sink);
    if (!added) {
      return absl::FailedPreconditionError(absl::StrCat(
          "thread ", sink->thread, " is already profiled (by the operator profiler of rank ",
          it->second->rank, "); one profiler per thread at a time"));
    }
    Callback& callback = sink->record_shapes ? with_shapes_ : plain_;
    if (callback.users++ == 0) {
      callback.handle = at::addGlobalCallback(
          at::RecordFunctionCallback(sink->record_shapes ? &OnStart<true> : &OnStart<false>, &OnEnd)
              .needsInputs(sink->record_shapes));
    }
    return absl::OkStatus();
  }

  // After Remove no new event reaches `sink`.
  void Remove(const std::shared_ptr<Sink>& sink) {
    {
      absl::MutexLock lock(&mu_);
      auto it = sinks_.find(sink->thread);
      if (it == sinks_.end() || it->second != sink) return;
      sinks_.erase(it);
      Callback& callback = sink->record_shapes ? with_shapes_ : plain_;
      if (--callback.users == 0) at::removeCallback(callback.handle);
    }
    absl::MutexLock lock(&sink->mu);
    sink->open = false;
  }

 private:
  struct Callback {
    int users = 0;
    at::CallbackHandle handle = 0;
  };
  // What OnStart hands to OnEnd.
  struct Context : at::ObserverContext {
    std::shared_ptr<Sink> sink;
    OperatorEvent event;
  };

  std::shared_ptr<Sink> Find(const at::RecordFunction& fn) {
    absl::ReaderMutexLock lock(&mu_);
    if (sinks_.empty()) return nullptr;
    auto it = sinks_.find(at::RecordFunction::currentThreadId());
    if (it == sinks_.end() && fn.scope() == at::RecordScope::BACKWARD_FUNCTION &&
        fn.forwardThreadId() != 0) {
      it = sinks_.find(fn.forwardThreadId());
    }
    return it == sinks_.end() ? nullptr : it->second;
  }

  template <bool kShapes>
  static std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
    std::shared_ptr<Sink> sink = Get().Find(fn);
    // The other callback serves this profiler.
    if (sink == nullptr || sink->record_shapes != kShapes) return nullptr;
    auto context = std::make_unique<Context>();
    context->sink = std::move(sink);
    OperatorEvent& event = context->event;
    event.name = fn.name();
    event.category = Category(fn.scope());
    event.thread = at::RecordFunction::currentThreadId();
    if (kShapes) {
      for (const c10::IValue& input : fn.inputs()) {
        event.input_shapes.push_back(input.isTensor() ? input.toTensor().sizes().vec()
                                                      : std::vector<int64_t>{});
      }
    }
    event.start_us = SteadyMicros();
    return context;
  }

  static void OnEnd(const at::RecordFunction& /*fn*/, at::ObserverContext* base) {
    if (base == nullptr) return;
    const int64_t end_us = SteadyMicros();
    auto* context = static_cast<Context*>(base);
    context->event.duration_us = end_us - context->event.start_us;
    Sink& sink = *context->sink;
    absl::MutexLock lock(&sink.mu);
    if (sink.open) sink.events.push_back(std::move(context->event));
  }

  absl::Mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Sink>> sinks_ ABSL_GUARDED_BY(mu_);
  Callback with_shapes_ ABSL_GUARDED_BY(mu_);
  Callback plain_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<StepRange> ParseStepRange(absl::string_view spec) {
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile steps \"", spec, "\": ", why, "; expected N:M (steps N to M) or N (one step)"));
  };
  std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
  if (parts.size() > 2) return invalid("more than one ':'");
  StepRange range;
  if (!absl::SimpleAtoi(parts[0], &range.first)) return invalid("N is not an integer");
  range.last = range.first;
  if (parts.size() == 2 && !absl::SimpleAtoi(parts[1], &range.last)) {
    return invalid("M is not an integer");
  }
  if (range.first < 0) return invalid("steps must be >= 0");
  if (range.last < range.first) return invalid("M must be >= N");
  return range;
}

absl::StatusOr<std::unique_ptr<OperatorProfiler>> OperatorProfiler::Create(
    const OperatorProfilerOptions& options) {
  if (options.steps.first < 0 || options.steps.last < options.steps.first) {
    return absl::InvalidArgumentError(absl::StrCat("profile steps ", options.steps.first, ":",
                                                   options.steps.last,
                                                   " are not a range N:M with 0 <= N <= M"));
  }
  if (options.rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " must be >= 0"));
  }
  return std::unique_ptr<OperatorProfiler>(new OperatorProfiler(options));
}

OperatorProfiler::~OperatorProfiler() {
  if (!recording_) return;
  Recorder::Get().Remove(sink_);
  LOG(WARNING) << "dropping the unfinished operator profile of rank " << options_.rank;
}

absl::Status OperatorProfiler::BeginStep(int64_t step) {
  if (!owner_known_) {
    owner_ = std::this_thread::get_id();
    owner_known_ = true;
  } else if (owner_ != std::this_thread::get_id()) {
    return NotOwner("BeginStep");
  }
  if (in_step_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "OperatorProfiler::BeginStep(", step, ") while step ", current_step_, " was not ended"));
  }
  in_step_ = true;
  current_step_ = step;
  // The loop jumped past the range's end (e.g. resumed from a checkpoint):
  // keep what was recorded, none of this step.
  if (recording_ && step > options_.steps.last) return Collect();
  if (!options_.steps.Contains(step)) return absl::OkStatus();
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat("OperatorProfiler::BeginStep(", step, "): the profile of steps ",
                     options_.steps.first, ":", options_.steps.last, " already finished"));
  }
  if (!recording_) PP_RETURN_IF_ERROR(Start());
  steps_.push_back(StepSpan{step, SteadyMicros(), 0, at::RecordFunction::currentThreadId()});
  return absl::OkStatus();
}

absl::Status OperatorProfiler::EndStep(int64_t step) {
  if (owner_known_ && owner_ != std::this_thread::get_id()) return NotOwner("EndStep");
  if (!in_step_ || step != current_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("OperatorProfiler::EndStep(", step, ") without BeginStep(", step, ")"));
  }
  in_step_ = false;
  if (!recording_ || !options_.steps.Contains(step)) return absl::OkStatus();
  steps_.back().end_us = SteadyMicros();
  if (step == options_.steps.last) return Collect();
  return absl::OkStatus();
}

absl::Status OperatorProfiler::Stop() {
  if (!recording_) return absl::OkStatus();
  if (owner_ != std::this_thread::get_id()) return NotOwner("Stop");
  if (in_step_ && !steps_.empty() && steps_.back().end_us == 0) {
    steps_.back().end_us = SteadyMicros();
  }
  return Collect();
}

absl::Status OperatorProfiler::Start() {
  auto sink = std::make_shared<Sink>();
  sink->thread = at::RecordFunction::currentThreadId();
  sink->rank = options_.rank;
  sink->record_shapes = options_.record_shapes;
  PP_RETURN_IF_ERROR(Recorder::Get().Add(sink));
  sink_ = std::move(sink);
  recording_ = true;
  return absl::OkStatus();
}

absl::Status OperatorProfiler::Collect() {
  recording_ = false;
  finished_ = true;
  Recorder::Get().Remove(sink_);
  {
    absl::MutexLock lock(&sink_->mu);
    events_ = std::move(sink_->events);
  }
  sink_.reset();
  // Parents before children: earlier start first, longer first on ties.
  std::stable_sort(events_.begin(), events_.end(),
                   [](const OperatorEvent& a, const OperatorEvent& b) {
                     if (a.start_us != b.start_us) return a.start_us < b.start_us;
                     return a.duration_us > b.duration_us;
                   });
  return absl::OkStatus();
}

absl::StatusOr<std::string> OperatorProfiler::ChromeTraceJson() const {
  if (!finished_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the operator profile of steps ", options_.steps.first, ":", options_.steps.last,
        " on rank ", options_.rank, " has not finished (last profiled step not ended)"));
  }
  const int pid = options_.rank;
  nlohmann::json trace = nlohmann::json::array();
  trace.push_back({{"name", "process_name"},
                   {"ph", "M"},
                   {"pid", pid},
                   {"args", {{"name", absl::StrCat("rank ", pid, " operators")}}}});
  std::set<uint64_t> threads;
  for (const OperatorEvent& e : events_) threads.insert(e.thread);
  for (const StepSpan& s : steps_) threads.insert(s.thread);
  for (uint64_t thread : threads) {
    trace.push_back({{"name", "thread_name"},
                     {"ph", "M"},
                     {"pid", pid},
                     {"tid", thread},
                     {"args", {{"name", absl::StrCat("thread ", thread)}}}});
  }
  for (const StepSpan& s : steps_) {
    trace.push_back({{"name", absl::StrCat("ProfilerStep#", s.step)},
                     {"cat", "step"},
                     {"ph", "X"},
                     {"pid", pid},
                     {"tid", s.thread},
                     {"ts", s.start_us},
                     {"dur", s.end_us - s.start_us}});
  }
  for (const OperatorEvent& e : events_) {
    nlohmann::json event = {{"name", e.name},      {"cat", e.category}, {"ph", "X"},
                            {"pid", pid},          {"tid", e.thread},   {"ts", e.start_us},
                            {"dur", e.duration_us}};
    if (!e.input_shapes.empty()) event["args"] = {{"Input Dims", e.input_shapes}};
    trace.push_back(std::move(event));
  }
  nlohmann::json root = {{"traceEvents", std::move(trace)},
                         {"displayTimeUnit", "ms"},
                         {"otherData",
                          {{"rank", pid},
                           {"clock", "steady_clock_us"},
                           {"steps", {options_.steps.first, options_.steps.last}},
                           {"profiler", absl::StrCat("LibTorch ", torch_compat::LibTorchVersion(),
                                                     " RecordFunction (CPU, process-wide)")}}}};
  return root.dump();
}

absl::Status OperatorProfiler::WriteChromeTrace(absl::string_view path) const {
  PP_ASSIGN_OR_RETURN(std::string json, ChromeTraceJson());
  std::ofstream out{std::string(path)};
  out << json;
  out.close();
  if (!out) {
    return absl::InternalError(absl::StrCat("cannot write the operator trace of rank ",
                                            options_.rank, " to \"", path, "\""));
  }
  return absl::OkStatus();
}

}  // namespace pp
