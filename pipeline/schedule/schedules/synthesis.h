// Schedule synthesis: the schedule with the smallest simulated makespan found
// under a per-rank memory cap, for given per-virtual-stage costs.
//
// Method (issue #27):
//  1. List scheduling in the spirit of the zero-bubble authors' heuristic:
//     an event-driven greedy that, whenever a rank is free, starts the ready
//     action with the earliest start, preferring the backward (I or B: the
//     critical path) or the forward (variants), admitting a forward only
//     while the memory cap allows it (a micro-batch that entered a rank keeps
//     room for all its local forwards, so the greedy cannot lock itself out),
//     and filling idle gaps with W (a W that would delay a known arrival is
//     held back, or started anyway: variants). A set of variants (priority,
//     in-flight limits per rank, W policy) gives several starts.
//  2. Optionally, the registered schedules with the same placement that fit
//     the cap are starts too (a B becomes I then W when the backward is split),
//     so the result is never worse than any of them.
//  3. Local search over the simulator (SimulateAsExecuted: the same model
//     as schedule_explorer, with receives deferred as the CPU runtime runs
//     them when defer_receives is set): move one action of one rank to
//     another position (a W or an F mostly), keep the move when the schedule
//     still simulates, fits the cap and is no slower; bounded by a number
//     of evaluations, with restarts from the best starts. Deterministic for
//     a seed.
// The result's makespan is the simulator's; the lower bound next to it is
// max(busiest rank: its start offset + its total work; one micro-batch's
// critical path after stage 0's m forwards), so the gap is visible.
//
// No exact solver: the only well-kept ones in Debian's archive (glpk, coinor-
// cbc, highs) would need a time-indexed MIP whose size grows with
// p * m * v * horizon; at the grid's sizes (p = 8, m = 32) it would not close
// in seconds, and at p = 4, m = 4 the heuristic already meets the lower bound.
// See docs/schedules.md ("Synthesis: the method").
#ifndef PIPELINE_SCHEDULE_SCHEDULES_SYNTHESIS_H_
#define PIPELINE_SCHEDULE_SCHEDULES_SYNTHESIS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

enum class SynthesisPlacement {
  kLooped,  // virtual stage c * p + r on rank r, any v
  kV,       // VPlacement: v = 2, rank r holds r and 2p - 1 - r
};

struct SynthesisOptions {
  int num_stages = 1;        // p
  int num_microbatches = 1;  // m
  int num_chunks = 1;        // v (2 for kV)
  SynthesisPlacement placement = SynthesisPlacement::kLooped;
  // Emit I and W (the backward split; a registered start may keep some B);
  // false: B only (costs' B is used).
  bool split_backward = true;
  // Costs as the simulator takes them: per action type, times
  // stage_multiplier, or a virtual stage's own (stage_costs); comm per message.
  SimulationCosts costs;
  // Per rank cap on the simulator's peak memory (units: one virtual stage's
  // activations for one micro-batch). nullopt: 1F1B's peak at v = 1 in the
  // same bytes, min(p, m) * v.
  std::optional<double> memory_cap;
  std::uint64_t seed = 0;
  // Simulator evaluations of the local search (deterministic); 0 = starts only.
  int max_evaluations = 2000;
  // Also start from every registered schedule (except synth*) with this
  // placement and v that fits the cap.
  bool seed_with_registered = true;
  // All list-scheduling variants (about a hundred); false: two of them
  // (for callers that synthesise many shapes, like the registered "synth").
  bool all_variants = true;
  // Extra starts (e.g. a schedule a caller already has); same shape required.
  std::vector<Schedule> extra_starts;
  // Simulate every candidate as the runtime executes it: with
  // DeferReceives (SimulateAsExecuted). The CPU runtime defers receives; a
  // schedule searched without it is tuned to waits the runtime does not have
  // (issue #27).
  bool defer_receives = false;
  // Name of the returned schedule.
  std::string name = "synth";
};

struct SynthesisResult {
  Schedule schedule;
  SimulationResult simulation;  // SimulateAsExecuted(schedule, costs, defer_receives)
  double makespan = 0;          // simulation.makespan
  double memory_cap = 0;        // the cap used
  double peak_memory = 0;       // max over ranks of simulation.peak_memory
  double lower_bound = 0;       // max of the two below
  double rank_work_bound = 0;   // busiest rank: start offset + total compute
  double critical_path_bound = 0;
  std::string start;          // the start the result came from
  double start_makespan = 0;  // that start's makespan before the search
  int evaluations = 0;        // simulator calls
};

// The smallest cap any schedule of this shape fits: one micro-batch's
// activations on every local stage of a rank (v; 2 for kV).
double MinimumMemoryCap(const SynthesisOptions& options);

// Lower bounds only (no search): fills rank_work_bound, critical_path_bound
// and lower_bound. InvalidArgument as Synthesize for bad shapes.
absl::StatusOr<SynthesisResult> SynthesisLowerBound(const SynthesisOptions& options);

// InvalidArgument naming the value: p, m or v below 1, kV with v != 2,
// max_evaluations < 0, a cap below MinimumMemoryCap (or not finite), costs
// the simulator refuses, an extra start of another shape. The returned
// schedule passes ValidateSchedule; Internal if it does not (a bug).
absl::StatusOr<SynthesisResult> Synthesize(const SynthesisOptions& options);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_SCHEDULES_SYNTHESIS_H_
