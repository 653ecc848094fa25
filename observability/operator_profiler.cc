#include "observability/operator_profiler.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>

#include <ATen/record_function.h>
#include <glog/logging.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"
#include "common/torch_status.h"

namespace pp {
namespace {

namespace profiler = torch::autograd::profiler;
namespace profiler_impl = torch::profiler::impl;

int64_t SteadyMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Category(const profiler::KinetoEvent& e) {
  if (e.deviceType() != c10::DeviceType::CPU) return "device";
  switch (static_cast<at::RecordScope>(e.scope())) {
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
                   " called from another thread than its first call: LibTorch's profiler "
                   "records the thread that runs the steps"));
}

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
  absl::Status status =
      TorchCall("stopping LibTorch's profiler", [] { (void)profiler::disableProfiler(); });
  LOG_IF(WARNING, !status.ok()) << "dropping an unfinished operator profile: " << status;
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
  const profiler_impl::ProfilerConfig config(profiler_impl::ProfilerState::KINETO,
                                             /*report_input_shapes=*/options_.record_shapes);
  PP_RETURN_IF_ERROR(TorchCall("starting LibTorch's profiler", [&] {
    // prepareProfiler first: LibTorch 2.x's Kineto crashes in startTrace
    // without it (1.13 without Kineto accepts both).
    profiler::prepareProfiler(config, {profiler_impl::ActivityType::CPU});
    profiler::enableProfiler(config, {profiler_impl::ActivityType::CPU});
  }));
  recording_ = true;
  anchor_before_us_ = SteadyMicros();
  { RECORD_USER_SCOPE(kProfilerAnchorName); }
  anchor_after_us_ = SteadyMicros();
  return absl::OkStatus();
}

absl::Status OperatorProfiler::Collect() {
  std::unique_ptr<profiler::ProfilerResult> result;
  recording_ = false;
  finished_ = true;
  PP_RETURN_IF_ERROR(
      TorchCall("stopping LibTorch's profiler", [&] { result = profiler::disableProfiler(); }));
  const std::vector<profiler::KinetoEvent>& raw = result->events();
  auto anchor = std::find_if(raw.begin(), raw.end(), [](const profiler::KinetoEvent& e) {
    return e.name() == kProfilerAnchorName;
  });
  if (anchor == raw.end()) {
    return absl::InternalError(
        "LibTorch's profiler did not record pipe's clock anchor; cannot place its events on "
        "the steady clock");
  }
  // profiler clock + offset = steady clock; error at most half the anchor's
  // window (a few microseconds).
  const int64_t offset =
      (anchor_before_us_ + anchor_after_us_) / 2 - torch_compat::EventStartUs(*anchor);
  events_.clear();
  events_.reserve(raw.size());
  for (const profiler::KinetoEvent& e : raw) {
    if (&e == &*anchor) continue;
    OperatorEvent out;
    out.name = e.name();
    out.category = Category(e);
    out.start_us = torch_compat::EventStartUs(e) + offset;
    out.duration_us = torch_compat::EventDurationUs(e);
    out.thread = e.startThreadId();
    if (e.hasShapes()) {
      for (const std::vector<int64_t>& shape : e.shapes()) out.input_shapes.push_back(shape);
    }
    events_.push_back(std::move(out));
  }
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
                                                     " RecordFunction (CPU)")}}}};
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
