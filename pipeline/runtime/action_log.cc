#include "pipeline/runtime/action_log.h"

#include <sys/resource.h>
#include <time.h>

#include <chrono>
#include <string>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "observability/memory_tracker.h"

namespace pp {
namespace {

// CLOCK_THREAD_CPUTIME_ID: getrusage's RUSAGE_THREAD times advance only at
// scheduler ticks (4 ms steps measured here), which reads 0 for most actions.
int64_t ThreadCpuMicros() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// How far this thread's CPU clock moves at a time: about 1 us on a plain
// Linux kernel, but a sandbox may advance it in scheduler ticks, where an
// action shorter than a tick reads 0 or one tick. Measured once,
// spinning on the clock for at most 200 ms of wall time; -1 if it never moved.
int64_t ThreadCpuClockStepMicros() {
  static const int64_t step = [] {
    const int64_t deadline = NowMicros() + 200000;
    // The first change aligns with the clock; the next two are measured.
    int64_t last = ThreadCpuMicros();
    int64_t smallest = -1;
    for (int change = 0; change < 3; ++change) {
      int64_t now = last;
      while ((now = ThreadCpuMicros()) == last) {
        if (NowMicros() > deadline) return smallest;
      }
      if (change > 0 && (smallest < 0 || now - last < smallest)) smallest = now - last;
      last = now;
    }
    return smallest;
  }();
  return step;
}

const char* Kind(const ObservedStep& step) {
  return step.forward_only ? "eval step " : "train step ";
}

std::string Peer(const ObservedStep& step, const Action& a) {
  return IsCommunication(a.type) ? absl::StrCat(" peer ", step.program->PeerRank(a)) : "";
}

}  // namespace

ActionLog::ThreadUsage ActionLog::ThreadUsageNow() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  ThreadUsage u;
  u.cpu_us = ThreadCpuMicros();
  u.minor_faults = usage.ru_minflt;
  u.preemptions = usage.ru_nivcsw;
  return u;
}

void ActionLog::StepStart(const ObservedStep& step) {
  if (VLOG_IS_ON(1) && !logged_cpu_clock_step_) {
    // action_costs.py reads it to say when per-action thread CPU is too
    // coarse to mean anything.
    VLOG(1) << "thread cpu clock step " << ThreadCpuClockStepMicros() << " us";
    logged_cpu_clock_step_ = true;
  }
}

void ActionLog::ActionStart(const ObservedStep& step, const Action& a) {
  if (!VLOG_IS_ON(1)) return;
  VLOG(1) << Kind(step) << step.step << " start " << ActionToString(a) << " mb " << a.microbatch
          << Peer(step, a);
  start_usage_ = ThreadUsageNow();
  start_us_ = NowMicros();
}

void ActionLog::ActionEnd(const ObservedStep& step, const Action& a) {
  if (!VLOG_IS_ON(1)) return;
  const int64_t end_us = NowMicros();
  // Compute actions also log what they cost this thread; communication
  // lines end with their duration.
  std::string usage;
  if (IsCompute(a.type)) {
    const ThreadUsage u1 = ThreadUsageNow();
    usage = absl::StrCat(" (thread cpu ", u1.cpu_us - start_usage_.cpu_us, " us, ",
                         u1.minor_faults - start_usage_.minor_faults, " page faults, ",
                         u1.preemptions - start_usage_.preemptions, " preemptions)");
  }
  // The process's live CPU tensor bytes after the action, and the step's
  // peak so far: an action that raises the peak reached it inside itself.
  std::string memory;
  if (CpuMemoryTrackingInstalled()) {
    const MemoryStats m = CpuMemoryStats();
    memory = absl::StrCat(" cpu live ", m.current_bytes, " B peak ", m.peak_bytes, " B");
  }
  VLOG(1) << Kind(step) << step.step << " end " << ActionToString(a) << " mb " << a.microbatch
          << Peer(step, a) << " " << (end_us - start_us_) << " us" << usage << memory;
}

}  // namespace pp
