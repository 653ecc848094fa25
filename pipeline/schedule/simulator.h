// Cost-model simulation of a lowered program: makespan, per-rank busy and
// idle time, bubble fraction and peak in-flight activations, plus the timeline
// (for render.h and chrome_trace.h).
//
// Model: each rank runs its program in order; a compute takes its type's cost
// times the stage's multiplier (an OVERLAP_F_B the sum of its halves', run
// back to back as the runtime does: no overlap is modelled; the timeline has
// one event per half); a RECV completes no earlier than
// the arrival of the message (see SimulationCosts::blocking_sends for the two
// send models); tail actions take no time. Busy time counts compute
// only. A forward's activations are in flight from its F until its B (or W
// when the backward is split).
//
// Memory model (per rank, in units of one virtual stage's activations for one
// micro-batch): F adds 1; a full B frees 1; a split backward frees
// `MemorySplit::InputFraction()` at its I and the rest at its W (what I keeps
// for W: the inputs of the weight gradients). The zero-bubble paper's
// per-layer figures (arXiv 2401.10241, section 2: activations 74 units of
// which the weight gradients need 32) give the default: I frees 42/74, W
// 32/74. Peak memory is the maximum, after each F, of the running sum.
#ifndef PIPELINE_SCHEDULE_SIMULATOR_H_
#define PIPELINE_SCHEDULE_SIMULATOR_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/schedule/chrome_trace.h"
#include "pipeline/schedule/lowering.h"
#include "pipeline/schedule/schedule.h"

namespace pp {

// How a split backward frees a forward's activations: I frees
// input / (input + weight) of them, W the rest. Parts, not fractions.
struct MemorySplit {
  double input = 42;   // freed by I
  double weight = 32;  // freed by W (held from I to W)
  double InputFraction() const { return input / (input + weight); }
};

// "I:42,W:32" (keys I and W, values >= 0, not both 0; missing keys keep their
// defaults). InvalidArgument names a bad key or value.
absl::StatusOr<MemorySplit> ParseMemorySplit(absl::string_view text);

// Time of one transport message as a function of its size: latency +
// bytes * per_byte (per_byte = 1 / bandwidth), in the costs' time unit.
struct MessageCost {
  double latency = 0;
  double per_byte = 0;
  double Of(double bytes) const { return latency + per_byte * bytes; }
};

// One measured message: its size and its one-way time (e.g. half the round
// trip of a ping-pong).
struct MessageSample {
  double bytes = 0;
  double seconds = 0;
};

// Least-squares fit of MessageCost to `samples`, weighted by 1 / seconds^2
// (relative residuals: sizes span orders of magnitude, and an unweighted fit
// would let the largest message decide the latency). Both parameters are
// kept >= 0: where the unconstrained fit makes one negative, it is 0 and the
// other is refitted alone. InvalidArgument names the bad sample (negative or
// non-finite bytes or seconds) or says that fewer than two distinct sizes
// were given.
absl::StatusOr<MessageCost> FitMessageCost(const std::vector<MessageSample>& samples);

struct SimulationCosts {
  double forward = 1;          // F
  double backward = 2;         // B
  double backward_input = 1;   // I
  double backward_weight = 1;  // W
  double comm = 0;             // per message (added to the message model below)
  // Message model: one SEND/RECV pair moves the transport messages of sizes
  // `message_bytes` (e.g. a control word and each tensor), each taking
  // message.Of(bytes); with the default (zero model, no sizes) a message costs
  // `comm` alone.
  MessageCost message;
  std::vector<double> message_bytes;
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
  MemorySplit memory;
};

// "F:1,B:2,W:0,comm:0" (keys F, B, I, W, comm, in any order; missing keys
// keep their defaults, except that a missing B is I + W, so "F:1,I:1,W:2"
// means B = 3). InvalidArgument names a bad key or value.
absl::StatusOr<SimulationCosts> ParseSimulationCosts(absl::string_view text);

struct SimulationResult {
  double makespan = 0;
  std::vector<double> busy;    // per rank: sum of compute durations
  std::vector<double> idle;    // per rank: makespan - busy
  double bubble_fraction = 0;  // sum(idle) / (ranks * makespan)
  // Per rank: idle time between the start of its first compute and the end of
  // its last, i.e. idle minus the head and tail of the step. Steps that
  // overlap (the zero-bubble paper's ZB-H2 without the optimizer barrier)
  // lose only this idle time.
  std::vector<double> inner_idle;
  std::vector<int> peak_inflight;  // per rank, in micro-batch x chunk units
  // Per rank: peak of the memory model above (F adds 1, B frees 1, I and W
  // free their parts of it), in the same units as peak_inflight.
  std::vector<double> peak_memory;
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
