// ActionObserver: what StageExecutor::Run tells whoever watches a step —
// its start and end, and each executed action's start and end. Traces,
// busy/idle time, `--v=1` action logs and the launcher's status page are
// observers (action_timer.h, action_log.h, the driver's status observer);
// the executor itself measures nothing.
//
// With no observer installed a step reads no clock and never waits for a
// device: on an accelerator the host queues the whole program and runs
// ahead of the device (device_streams.h). Observers decide what they cost:
// ActionTimer waits for the device at its step's start and end only.
//
//   ActionTimer timer(device, timeout);
//   executor.set_observer(&timer);
//   executor.Run(program, step, tail);
//   timer.timings();   // the step's actions, in program order
//
// Calls come from the executor's thread, in order: StepStart, then per
// executed action (an OVERLAP_F_B's halves one by one) ActionStart and, when
// it succeeded, ActionEnd; after a successful step's actions, per
// asynchronous collective one CollectiveCompleted; StepEnd once the step's
// sends completed (also after a failure, with its status).
#ifndef PIPELINE_RUNTIME_ACTION_OBSERVER_H_
#define PIPELINE_RUNTIME_ACTION_OBSERVER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "pipeline/schedule/ir/action.h"
#include "pipeline/schedule/ir/lowering.h"

namespace pp {

// The step an observer is told about.
struct ObservedStep {
  int rank = 0;               // pipeline rank of the executor
  int64_t step = 0;           // the Trainer's step (0-based), or the eval batch's
  bool forward_only = false;  // an evaluation pass
  // The program as executed (after DeferReceives): PeerRank() of its actions.
  const LoweredProgram* program = nullptr;
};

class ActionObserver {
 public:
  virtual ~ActionObserver() = default;

  virtual void StepStart(const ObservedStep& step) {}
  virtual void ActionStart(const ObservedStep& step, const Action& action) {}
  virtual void ActionEnd(const ObservedStep& step, const Action& action) {}
  // The collective that executed action `started` began without waiting for
  // it (vocabulary_async_collectives) completed at `completed_us`
  // (steady_clock microseconds, ActionTiming's clock, as the backend's thread
  // reported it; the end of the wait for it where the backend reports none).
  virtual void CollectiveCompleted(const ObservedStep& step, const Action& started,
                                   int64_t completed_us) {}
  // `status`: the step's outcome. An error returned here (a device that does
  // not finish) fails a step that had succeeded.
  virtual absl::Status StepEnd(const ObservedStep& step, const absl::Status& status) {
    return absl::OkStatus();
  }
};

// Fans every call out to several observers (borrowed; null entries are
// skipped): the starts in the order given, the ends in reverse, nested like
// scopes, so the last one (a timer) sees only the action itself. StepEnd
// calls them all and returns the first error.
class ActionObservers : public ActionObserver {
 public:
  explicit ActionObservers(std::vector<ActionObserver*> observers);

  void StepStart(const ObservedStep& step) override;
  void ActionStart(const ObservedStep& step, const Action& action) override;
  void ActionEnd(const ObservedStep& step, const Action& action) override;
  void CollectiveCompleted(const ObservedStep& step, const Action& started,
                           int64_t completed_us) override;
  absl::Status StepEnd(const ObservedStep& step, const absl::Status& status) override;

  bool empty() const { return observers_.empty(); }

 private:
  std::vector<ActionObserver*> observers_;
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_ACTION_OBSERVER_H_
