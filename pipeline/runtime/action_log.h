// ActionLog: the observer (action_observer.h) behind `--v=1`'s action lines.
// Every action as it starts and ends, so a hang shows in the log as a start
// without its end:
//
//   train step 54 start 0RECV_B2 mb 2 peer 1
//   train step 54 end 0RECV_B2 mb 2 peer 1 812 us
//   train step 54 end 1B2 mb 2 3121 us (thread cpu 3050 us, 0 page faults, 1 preemptions)
//       cpu live 9278720 B peak 15326848 B
//
// (`step` is the Trainer's, 0-based, or the eval batch's; peer = the other
// end's pipe rank.) Compute actions also log what they cost the executor's
// thread: with one intra-op and one BLAS thread every kernel of an action runs
// there, so the differences are the action's own cost even on a loaded
// machine, where the wall clock is not (tools/action_costs.py reads
// them; check_observability_run.py the communication lines' durations).
// Every end line carries, once the CPU memory tracker is installed
// (observability/memory_tracker.h), the process's live CPU tensor bytes after
// the action and the step's peak so far: an action that raises the peak
// reached it inside itself (how the memory planner's terms were measured,
// docs/schedules.md).
// Durations are host time: on a device they time the launches, not the
// kernels (traces have the device's times: action_timer.h).
//
// The driver installs it when VLOG_IS_ON(1); it logs at VLOG(1) itself.
// Not thread-safe.
#ifndef PIPELINE_RUNTIME_ACTION_LOG_H_
#define PIPELINE_RUNTIME_ACTION_LOG_H_

#include <cstdint>

#include "pipeline/runtime/action_observer.h"

namespace pp {

class ActionLog : public ActionObserver {
 public:
  void StepStart(const ObservedStep& step) override;
  void ActionStart(const ObservedStep& step, const Action& action) override;
  void ActionEnd(const ObservedStep& step, const Action& action) override;

 private:
  // This thread's CPU time, minor page faults and involuntary context
  // switches (preemptions) so far.
  struct ThreadUsage {
    int64_t cpu_us = 0;
    int64_t minor_faults = 0;
    int64_t preemptions = 0;
  };
  static ThreadUsage ThreadUsageNow();

  bool logged_cpu_clock_step_ = false;  // logs the clock's step once
  ThreadUsage start_usage_;
  int64_t start_us_ = 0;
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_ACTION_LOG_H_
