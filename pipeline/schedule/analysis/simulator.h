// Cost-model simulation of a lowered program: makespan, per-rank busy and
// idle time, bubble fraction and peak in-flight activations, plus the timeline
// (for render.h and chrome_trace.h).
//
// Model: each rank runs its program in order; a compute takes its type's cost
// times the stage's multiplier (an OVERLAP_F_B the sum of its halves', run
// back to back as the runtime does: no overlap is modelled; the timeline has
// one event per half); a RECV completes no earlier than
// the arrival of the message (see SimulationCosts::blocking_sends for the two
// send models); a SEND occupies its rank for the send cost and a RECV for the
// receive cost once its message is there. Compute costs are
// global per action type (times the stage's multiplier) unless a virtual
// stage has its own (SimulationCosts::stage_costs). Tail actions (REDUCE_TIED,
// REDUCE_GRAD, STEP) take their costs; a collective one starts on all its
// participants at the latest arrival (end = max(arrivals) + cost): REDUCE_TIED
// over the ranks linked by tie groups, STEP over all ranks when it all-reduces
// the gradient norm, REDUCE_GRAD locally (its data-parallel peers are not in
// the program). Busy time counts compute only (sends and the tail are idle
// time of the pipeline). A forward's activations are in flight from its F
// until its B (or W when the backward is split).
//
// Memory model (per rank, in units of one virtual stage's activations for one
// micro-batch): F adds 1; a full B frees 1; a split backward frees
// `MemorySplit::InputFraction()` at its I and the rest at its W (what I keeps
// for W: the inputs of the weight gradients). The zero-bubble paper's
// per-layer figures (arXiv 2401.10241, section 2: activations 74 units of
// which the weight gradients need 32) give the default: I frees 42/74, W
// 32/74. Peak memory is the maximum, after each F, of the running sum.
#ifndef PIPELINE_SCHEDULE_ANALYSIS_SIMULATOR_H_
#define PIPELINE_SCHEDULE_ANALYSIS_SIMULATOR_H_

#include <map>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/schedule/ir/chrome_trace.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/ir/schedule.h"

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

// One virtual stage's own costs; each given one replaces the global cost of
// its type as is (the stage multiplier does not apply to it). A stage whose
// I and W are given but not B gets B = I + W.
struct StageCosts {
  std::optional<double> forward, backward, backward_input, backward_weight;
  std::optional<double> reduce_grad;  // its <s>REDUCE_GRAD
};

// One rank's own tail and send costs (replacing the global ones).
struct RankCosts {
  std::optional<double> reduce_tied, step, send, recv;
};

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
  // Per virtual stage multiplier of the global compute and REDUCE_GRAD
  // costs; empty = all 1.
  std::vector<double> stage_multiplier;
  // Per virtual stage overrides (keys: stages in [0, p * v)).
  std::map<int, StageCosts> stage_costs;
  // Per micro-batch multiplier of every compute cost above (F, B, I, W, a
  // stage's own included): variable-length micro-batches, whose work differs
  // (e.g. each packed micro-batch's estimated cost over their mean). Empty:
  // all 1; else one entry >= 0 per micro-batch of the program.
  std::vector<double> microbatch_multiplier;
  // Tail costs, per action on its rank, after its collective has gathered.
  double reduce_tied = 0;  // REDUCE_TIED (0 on a rank in no tie group)
  double reduce_grad = 0;  // each <s>REDUCE_GRAD (times the stage multiplier)
  double step = 0;         // STEP
  // Time a SEND occupies the sending rank before its message leaves (the
  // runtime's hand-off to the transport), and a RECV the receiving rank once
  // the message is there (unpacking it).
  double send = 0;
  double recv = 0;
  // Per rank overrides of reduce_tied, step, send and recv (keys: ranks in
  // [0, p)).
  std::map<int, RankCosts> rank_costs;
  // Tie groups, each a set of virtual stages whose tied parameters are
  // all-reduced in REDUCE_TIED. Ranks linked through groups synchronise in one
  // collective (the runtime's per-group all-reduces, in key order, modelled as
  // one); a rank in no group does nothing there. nullopt: one group of all
  // ranks (e.g. a GPT whose embedding and head are tied, on p = 2).
  std::optional<std::vector<std::vector<int>>> tie_groups;
  // STEP all-reduces the gradient norm over all ranks (global grad-norm
  // clipping) before applying the optimizer: it is a collective of all ranks.
  bool step_all_reduce = false;
  // Vocabulary parallelism (vocab_passes.h): each rank's passes, per
  // micro-batch (times its multiplier), and each of their collectives once
  // all ranks are there (a collective of all ranks: it starts at the latest
  // arrival). The passes are busy time; the collectives are not.
  // output_s and output_t are the passes of the algorithm `barriers` says
  // (Schedule::vocab_barriers; 2 by default, what auto's measurement
  // schedule runs). The one-barrier algorithm moves one of OUT_T's two
  // [N, rows] x [rows, D] products into OUT_S, so a schedule of the other
  // algorithm is simulated with half of the two-barrier OUT_T moved: from 2
  // to 1, OUT_S = output_s + output_t / 2 and OUT_T = output_t / 2; from 1
  // to 2, OUT_S = output_s - output_t and OUT_T = 2 output_t (the same
  // total either way). Costs measured per type on a run of the schedule's
  // own algorithm are taken as they are.
  struct VocabCosts {
    double output_s = 0;    // OUT_S
    double output_t = 0;    // OUT_T
    double input_f = 0;     // IN_F
    double input_b = 0;     // IN_B
    double collective = 0;  // each OUT_BCAST, OUT_STATS, OUT_REDUCE, IN_REDUCE, IN_BCAST
    int barriers = 2;       // the algorithm output_s and output_t are of: 1 or 2
    // false: each collective blocks its rank until every rank is there and it
    // has run (end = latest arrival + collective). true (the runtime's
    // TrainerOptions::vocabulary_async_collectives): a rank only posts it and
    // goes on; the collective runs once every rank has posted it, and the
    // rank waits only where its result is read (OUT_S after OUT_BCAST, OUT_T
    // or the one-barrier OUT_REDUCE after OUT_STATS, IN_B after IN_BCAST,
    // stage 0's F after IN_REDUCE, the last stage's B or I after OUT_REDUCE).
    bool asynchronous = false;
  };
  VocabCosts vocab;
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

// The largest cost a parsed cost string holds: a schedule's sums of a million
// actions stay finite (F:1e308 simulated to a makespan of inf).
inline constexpr double kMaxSimulationCost = 1e12;

// "F:1,B:2,W:0,comm:0" (keys F, B, I, W, comm, SEND, RECV, STEP,
// REDUCE_TIED, REDUCE_GRAD, and the vocabulary's OUT_S, OUT_T, IN_F, IN_B,
// VOCAB_COMM (each collective), VOCAB_BARRIERS (1 or 2: the algorithm OUT_S
// and OUT_T were measured in, VocabCosts::barriers), VOCAB_ASYNC (0 or 1:
// VocabCosts::asynchronous), in any order; missing keys keep their
// defaults, except that a missing B is I + W, so "F:1,I:1,W:2" means B = 3). InvalidArgument names
// a bad key or value.
absl::StatusOr<SimulationCosts> ParseSimulationCosts(absl::string_view text);

// "0:F:1,B:2;1:F:1.2,I:1,W:1.1" -> stage_costs: ';'-separated
// STAGE:KEY:VALUE[,KEY:VALUE...] with keys F, B, I, W, REDUCE_GRAD (B = I + W
// when only I and W are given). InvalidArgument names a bad stage, key or
// value, or a stage given twice. Whether a stage exists is SimulateProgram's
// check.
absl::StatusOr<std::map<int, StageCosts>> ParseStageCosts(absl::string_view text);

// "0:STEP:0.005,SEND:0.0002;1:STEP:0.008" -> rank_costs: as ParseStageCosts,
// keyed by rank, with keys STEP, REDUCE_TIED, SEND, RECV.
absl::StatusOr<std::map<int, RankCosts>> ParseRankCosts(absl::string_view text);

// "0,3;1,2" -> tie groups of virtual stages (';' between groups, ',' between
// stages; a group needs 2 or more distinct stages); "none" -> no tie groups;
// "" -> nullopt (all ranks, the default). InvalidArgument names the bad part.
absl::StatusOr<std::optional<std::vector<std::vector<int>>>> ParseTieGroups(absl::string_view text);

// "2.5,0.4,1" -> SimulationCosts::microbatch_multiplier ("" -> empty: all
// 1). InvalidArgument naming an entry that is not a finite number >= 0.
absl::StatusOr<std::vector<double>> ParseMicrobatchMultipliers(absl::string_view text);

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
  // Every executed action, in program order per rank; tail actions only
  // when they take time.
  std::vector<TraceEvent> timeline;
  // With asynchronous vocabulary collectives (vocab.asynchronous), beside the
  // timeline: each posted collective from its post to its completion, a
  // background event naming the action that posted it (started_by), as a
  // measured trace shows it ("OUT_STATS3 in flight").
  std::vector<TraceEvent> in_flight;
};

// Simulates a lowered program; errors are the validator's (deadlock, missing
// input) or InvalidArgument for negative or non-finite costs, a multiplier list
// of the wrong size, or a stage, rank or tie-group stage out of range.
absl::StatusOr<SimulationResult> SimulateProgram(const LoweredProgram& program,
                                                 const SimulationCosts& costs);

// The lowering a schedule is simulated with under `costs`: the default
// options, with vocab_async_collectives = costs.vocab.asynchronous (the
// runtime lowers so under TrainerOptions::vocabulary_async_collectives).
LoweringOptions LoweringFor(const SimulationCosts& costs);

// Lower(schedule, LoweringFor(costs)), then SimulateProgram.
absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule, const SimulationCosts& costs);

// Simulate, but of the program as the runtime executes it: with
// `defer_receives` (StageExecutorOptions::defer_receives, the CPU runtime's
// default) each RECV moved to just before its consumer (DeferReceives).
// Lower() places receives by unit costs (LoweringOptions); with measured
// costs far from those (a first stage whose I is ~0 and W the whole
// backward), a RECV that Lower put early makes the simulated rank wait where
// the runtime computes on. Issue #27: at p = 2, m = 8 in V placement, zbv
// simulated 12% slower than it ran as lowered and within 2% deferred.
absl::StatusOr<SimulationResult> SimulateAsExecuted(const Schedule& schedule,
                                                    const SimulationCosts& costs,
                                                    bool defer_receives);

// SimulateAsExecuted without the timeline (left empty; every other figure the
// same), for searches that simulate thousands of candidates and read only
// their figures (synthesis.h): naming every action of the timeline cost such a
// search more than executing the program.
absl::StatusOr<SimulationResult> SimulateFiguresAsExecuted(const Schedule& schedule,
                                                           const SimulationCosts& costs,
                                                           bool defer_receives);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_ANALYSIS_SIMULATOR_H_
