// Cost-model simulation of a lowered program: makespan, per-rank busy and
// idle time, bubble fraction and peak in-flight activations, plus the timeline
// (for render.h and chrome_trace.h).
//
// Model: each rank runs its program in order; a compute takes its type's cost
// times the stage's multiplier; a RECV completes no earlier than
// the arrival of the message (see SimulationCosts::blocking_sends for the two
// send models); tail actions take no time. Busy time counts compute
// only. A forward's activations are in flight from its F until its B (or W
// when the backward is split).
#ifndef PIPELINE_SCHEDULE_SIMULATOR_H_
#define PIPELINE_SCHEDULE_SIMULATOR_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/schedule/chrome_trace.h"
#include "pipeline/schedule/lowering.h"
#include "pipeline/schedule/schedule.h"

namespace pp {

struct SimulationCosts {
  double forward = 1;          // F
  double backward = 2;         // B
  double backward_input = 1;   // I
  double backward_weight = 1;  // W
  double comm = 0;             // per message
  // Per virtual stage multiplier of compute costs; empty = all 1.
  std::vector<double> stage_multiplier;
  // false (default): buffered sends: a SEND returns at once and its RECV
  // finishes at max(posted, sent + comm), as when the runtime posts sends as
  // isend and waits for them later; the schedules' published bubble formulas
  // hold in this model. true: rendezvous: a SEND waits for its RECV and both
  // finish at max(ready) + comm (Gloo's blocking send); Lower() places
  // messages where both ranks are between computes when it can, which keeps
  // GPipe and 1F1B ideal but costs interleaved schedules part of their gain.
  bool blocking_sends = false;
};

// "F:1,B:2,W:0,comm:0" (keys F, B, I, W, comm, in any order; missing keys
// keep their defaults). InvalidArgument names a bad key or value.
absl::StatusOr<SimulationCosts> ParseSimulationCosts(absl::string_view text);

struct SimulationResult {
  double makespan = 0;
  std::vector<double> busy;        // per rank: sum of compute durations
  std::vector<double> idle;        // per rank: makespan - busy
  double bubble_fraction = 0;      // sum(idle) / (ranks * makespan)
  std::vector<int> peak_inflight;  // per rank, in micro-batch x chunk units
  // Every executed action (tail excluded), in program order per rank.
  std::vector<TraceEvent> timeline;
};

// Simulates a lowered program; errors are the validator's (deadlock, missing
// input) or InvalidArgument for negative costs / a multiplier list of the
// wrong size.
absl::StatusOr<SimulationResult> SimulateProgram(const LoweredProgram& program,
                                                 const SimulationCosts& costs);

// Lower(schedule) with default options, then SimulateProgram.
absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule, const SimulationCosts& costs);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_SIMULATOR_H_
