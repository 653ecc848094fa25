#include "pipeline/runtime/action_timer.h"

#include <optional>
#include <string>
#include <utility>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "absl/strings/str_cat.h"
#include "common/torch_compat_events.h"
#include "topology/device_transfer.h"

namespace pp {
namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// Events are reused from step to step (re-recording an event is allowed), so
// a traced step creates none after the first.
struct ActionTimer::DeviceEvents {
  explicit DeviceEvents(c10::Device device) : device(device), impl(device.type()) {}

  c10::Event& At(size_t i) {
    while (events.size() <= i) events.emplace_back(device.type(), c10::EventFlag::BACKEND_DEFAULT);
    return events[i];
  }
  void Record(size_t i) { At(i).record(impl.getStream(device)); }

  c10::Device device;
  c10::impl::VirtualGuardImpl impl;
  // [0]: the step's start; then each action's start and end.
  std::vector<c10::Event> events;
  size_t recorded = 0;
  // False where LibTorch's events cannot time (1.13): wait after each action.
  bool can_time = torch_compat::DeviceEventsCanTime();
  absl::Status error;  // a device wait of StepStart or ActionEnd that failed
};

ActionTimer::ActionTimer(c10::Device device, std::chrono::milliseconds timeout)
    : device_(device), timeout_(timeout) {
  if (!device_.is_cpu()) {
    if (!device_.has_index()) device_ = c10::Device(device.type(), 0);
    events_ = std::make_unique<DeviceEvents>(device_);
  }
}

ActionTimer::~ActionTimer() = default;

void ActionTimer::StepStart(const ObservedStep& step) {
  timings_.clear();
  busy_us_ = 0;
  wall_us_ = 0;
  if (events_ != nullptr) {
    events_->error = WaitForDevice(device_, timeout_, absl::StrCat("step ", step.step, " start"));
    events_->recorded = 0;
  }
  step_start_us_ = NowMicros();
  if (events_ != nullptr && events_->can_time) {
    events_->Record(0);
    events_->recorded = 1;
  }
}

void ActionTimer::ActionStart(const ObservedStep& step, const Action& action) {
  ActionTiming t{action, 0, 0};
  if (events_ != nullptr && events_->can_time) {
    events_->Record(events_->recorded++);
  } else {
    t.start_us = NowMicros();
  }
  timings_.push_back(t);
}

void ActionTimer::ActionEnd(const ObservedStep& step, const Action& action) {
  ActionTiming& t = timings_.back();
  if (events_ == nullptr) {
    t.end_us = NowMicros();
    if (IsCompute(action.type)) busy_us_ += t.end_us - t.start_us;
    return;
  }
  if (events_->can_time) {
    events_->Record(events_->recorded++);
    return;
  }
  if (events_->error.ok()) {
    events_->error = WaitForDevice(device_, timeout_, ActionToString(action));
  }
  t.end_us = NowMicros();
  if (IsCompute(action.type)) busy_us_ += t.end_us - t.start_us;
}

void ActionTimer::CollectiveCompleted(const ObservedStep& step, const Action& started,
                                      int64_t completed_us) {
  // The latest timing of the action (an action runs once per step).
  for (auto t = timings_.rbegin(); t != timings_.rend(); ++t) {
    if (t->action == started) {
      t->completed_us = completed_us;
      return;
    }
  }
}

absl::Status ActionTimer::StepEnd(const ObservedStep& step, const absl::Status& status) {
  if (!status.ok()) {
    // A failed step reports its own error; its device may never finish.
    timings_.clear();
    return absl::OkStatus();
  }
  if (events_ != nullptr) {
    if (!events_->error.ok()) return events_->error;
    absl::Status s = WaitForDevice(device_, timeout_, absl::StrCat("step ", step.step, " end"));
    if (!s.ok()) return s;
  }
  const int64_t end_us = NowMicros();
  wall_us_ = end_us - step_start_us_;
  if (events_ == nullptr || !events_->can_time) return absl::OkStatus();
  if (events_->recorded != 1 + 2 * timings_.size()) {
    return absl::InternalError(absl::StrCat("ActionTimer: ", events_->recorded, " events for ",
                                            timings_.size(), " actions"));
  }
  const c10::Event& base = events_->events[0];
  for (size_t i = 0; i < timings_.size(); ++i) {
    std::optional<double> start_ms =
        torch_compat::EventElapsedMilliseconds(base, events_->events[1 + 2 * i]);
    std::optional<double> end_ms =
        torch_compat::EventElapsedMilliseconds(base, events_->events[2 + 2 * i]);
    if (!start_ms.has_value() || !end_ms.has_value()) {
      return absl::InternalError("ActionTimer: device events cannot time in this build");
    }
    ActionTiming& t = timings_[i];
    t.start_us = step_start_us_ + static_cast<int64_t>(*start_ms * 1000.0);
    t.end_us = step_start_us_ + static_cast<int64_t>(*end_ms * 1000.0);
    if (IsCompute(t.action.type)) busy_us_ += t.end_us - t.start_us;
  }
  return absl::OkStatus();
}

}  // namespace pp
