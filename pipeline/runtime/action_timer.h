// ActionTimer: the observer (action_observer.h) that times a step's actions,
// for Chrome traces (Trainer::LastStepTrace) and busy/idle time.
//
// On the CPU an action's interval is two steady_clock reads. On an
// accelerator the host only queues kernels, so the host clock would time the
// launches: the timer records a device event (timing on) on the current
// stream around each action instead, and reads their elapsed times once, at
// the step's end. Its device waits are two per step: at the start (so the
// base event marks the host clock reading) and at the end (so every event has
// completed); the actions themselves run asynchronously. Where LibTorch's
// events cannot time (1.13), it waits for the device after each action.
//
// Not thread-safe; borrowed by the executor for the steps it observes.
#ifndef PIPELINE_RUNTIME_ACTION_TIMER_H_
#define PIPELINE_RUNTIME_ACTION_TIMER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "pipeline/runtime/action_observer.h"
#include "pipeline/schedule/ir/action.h"

namespace pp {

// Interval of one executed action.
struct ActionTiming {
  Action action;
  // steady_clock microseconds: comparable across the processes of one host
  // (on a device: the step start's host clock plus device time since).
  int64_t start_us = 0;
  int64_t end_us = 0;
  // An action that started a collective without waiting for it
  // (ActionObserver::CollectiveCompleted): when the collective completed;
  // -1 for every other action.
  int64_t completed_us = -1;
};

class ActionTimer : public ActionObserver {
 public:
  // `timeout` bounds each device wait (DeadlineExceeded naming the device).
  ActionTimer(c10::Device device, std::chrono::milliseconds timeout);
  ~ActionTimer() override;
  ActionTimer(const ActionTimer&) = delete;
  ActionTimer& operator=(const ActionTimer&) = delete;

  void StepStart(const ObservedStep& step) override;
  void ActionStart(const ObservedStep& step, const Action& action) override;
  void ActionEnd(const ObservedStep& step, const Action& action) override;
  void CollectiveCompleted(const ObservedStep& step, const Action& started,
                           int64_t completed_us) override;
  absl::Status StepEnd(const ObservedStep& step, const absl::Status& status) override;

  // The last step's actions in program order (complete after StepEnd).
  const std::vector<ActionTiming>& timings() const { return timings_; }
  std::vector<ActionTiming> TakeTimings() { return std::move(timings_); }
  // The last step: from StepStart to StepEnd, and in compute actions (F, B,
  // I, W).
  int64_t wall_us() const { return wall_us_; }
  int64_t busy_us() const { return busy_us_; }

 private:
  struct DeviceEvents;  // the device's events of one step (action_timer.cc)

  c10::Device device_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<DeviceEvents> events_;  // null on the CPU
  std::vector<ActionTiming> timings_;
  int64_t step_start_us_ = 0;
  int64_t wall_us_ = 0;
  int64_t busy_us_ = 0;
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_ACTION_TIMER_H_
