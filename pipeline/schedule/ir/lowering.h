// Lowering: a Schedule (compute actions per rank) -> the program each rank
// executes, with point-to-point communication and the step's tail inserted.
// The runtime executes a LoweredProgram action by action and knows no schedule
// by name.
//
// Lowered format (LoweredProgram::ranks[r], in execution order):
//   <s>F<mb>, <s>B<mb>, <s>I<mb>, <s>W<mb>   compute on local virtual stage s.
//   (<s>F<mb>;<t>B<mb'>)OVERLAP_F_B  both halves, kept paired (t may be I):
//                   the RECVs either half needs come before it, the SENDs of
//                   either half's output after it (a pair is one compute
//                   position in the rule below, costing F + B).
//   <s>RECV_F<mb>   receive the forward input of mb for stage s from stage s-1.
//   <s>SEND_F<mb>   send stage s's forward output of mb to stage s+1.
//   <s>RECV_B<mb>   receive the gradient of stage s's output of mb from s+1.
//   <s>SEND_B<mb>   send the gradient of stage s's input of mb to stage s-1
//                   (produced by B, or by I when B is split).
//   REDUCE_TIED     all-reduce tied-parameter gradients (each tie group this
//                   rank is in, in key order; a no-op for a rank with no ties).
//   <s>REDUCE_GRAD  all-reduce stage s's gradients over the data-parallel group.
//   STEP            optimizer step (with global grad-norm clipping).
// The peer of a SEND/RECV is the virtual stage PeerStage(action) (s+1 for
// SEND_F/RECV_B, s-1 for RECV_F/SEND_B), on rank stage_to_rank[peer]
// (LoweredProgram::PeerRank). Stages on the same rank hand over locally: no
// message is inserted between them. Stage 0 takes its input from the data
// loader and the last stage's B/I starts from the loss, so neither has a RECV
// there. Every message has exactly one SEND and one RECV, with the same stage
// pair and micro-batch; between one pair of ranks, messages are sent and
// received in the same order.
// Vocabulary parallelism (Schedule::vocab_parallel): every rank's passes
// OUT_S, OUT_T, IN_F, IN_B stay where the schedule lists them, and Lower()
// adds their collectives, each on every rank:
//   OUT_BCAST<mb>   after the last stage's F, before any rank's OUT_S;
//   OUT_STATS<mb>   after every rank's OUT_S, before any rank's OUT_T;
//   OUT_REDUCE<mb>  after every rank's OUT_T, before the last stage's B/I
//                   (one barrier: after OUT_STATS, before any rank's OUT_T,
//                   see vocab_async_collectives);
//   IN_REDUCE<mb>   after every rank's IN_F, before stage 0's F;
//   IN_BCAST<mb>    after stage 0's B/I, before any rank's IN_B
// (forward-only programs: IN_REDUCE, OUT_BCAST, OUT_STATS). A collective is
// one event of the global sequence below, timed when its last producer ends,
// so every rank meets the collectives in one order, with no message between
// two ranks left waiting across one.
// Training programs (Schedule::forward_only == false) end with the tail:
// REDUCE_TIED, then <s>REDUCE_GRAD for each local stage in the order its last
// backward (B or W) appears, then STEP. Forward-only programs have no tail.
//
// Deadlock-freedom rule (holds even if every SEND blocks until its RECV is
// posted, i.e. rendezvous semantics):
//  1. Time the compute actions by list scheduling: each rank runs its actions
//     in the listed order, each as soon as its inputs exist (F(s,mb) after
//     F(s-1,mb); B/I(s,mb) after F(s,mb) and B/I(s+1,mb); W after I), with
//     the positive integer costs of LoweringOptions.
//  2. Every input that crosses ranks becomes one message, timed at the
//     earliest instant t in [end of producer, start of consumer] at which
//     both ranks are between computes (so neither waits for the other when
//     the real costs match these), or at the end of the producer if there is
//     no such instant.
//  3. Sort all events into one global sequence by (time, messages before
//     computes, then producing stage, direction, micro-batch for messages and
//     rank for computes); each rank's program is the
//     projection of that sequence: a compute becomes itself, a message becomes
//     SEND on the producer's rank and RECV on the consumer's.
// Because every rank's program is the projection of one global sequence in
// which a message is a joint step of its two ranks, running that sequence in
// order is an execution in which each SEND meets its RECV: no cycle of waits
// can exist. A producer (cost >= 1) precedes its message, which precedes the
// consumer (which starts at or after t). The schedule's compute order per
// rank is kept. The validator re-checks the result by simulation.
// The tail's collectives come after every SEND/RECV of their rank, so a rank
// waiting in one never holds up another rank's point-to-point traffic.
#ifndef PIPELINE_SCHEDULE_IR_LOWERING_H_
#define PIPELINE_SCHEDULE_IR_LOWERING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/schedule/ir/action.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

// Costs used only to order messages among computes (step 1 above). Positive
// integers; the defaults match the usual backward = 2 x forward ratio.
struct LoweringOptions {
  int forward_cost = 1;
  int backward_cost = 2;
  int backward_input_cost = 1;
  int backward_weight_cost = 1;
  int vocab_cost = 1;  // each vocabulary pass (OUT_S, OUT_T, IN_F, IN_B)
  // Append the tail (REDUCE_TIED, REDUCE_GRAD, STEP) to training programs.
  bool include_tail = true;
  // The program's vocabulary collectives are asynchronous (TrainerOptions::
  // vocabulary_async_collectives, SimulationCosts::vocab.asynchronous). The
  // one-barrier OUT_REDUCE rescales with OUT_STATS's result as it starts:
  // blocking, it goes right after OUT_STATS (one wait for both);
  // asynchronous, one unit before its reader, the last stage's B/I, where
  // that is later (and before every rank's OUT_T of the micro-batch, which
  // ends the state it rescales), so that a rank does not wait for every
  // rank's OUT_S there but for what has not arrived by then.
  bool vocab_async_collectives = false;
};

// The per-rank programs. Plain value type.
struct LoweredProgram {
  std::string schedule_name;
  int num_stages = 0;        // p (ranks)
  int num_microbatches = 0;  // m
  int num_chunks = 1;        // v
  bool forward_only = false;
  bool vocab_parallel = false;     // Schedule::vocab_parallel
  int vocab_barriers = 2;          // Schedule::vocab_barriers
  std::vector<int> stage_to_rank;  // virtual stage -> rank
  RankActions ranks;               // ranks[r]: rank r's program

  int num_virtual_stages() const { return num_stages * num_chunks; }
  // The rank of the other end of a communication action.
  // REQUIRES: IsCommunication(action.type), peer stage in range.
  int PeerRank(const Action& action) const;
  // Virtual stages placed on `rank`, ascending.
  std::vector<int> LocalStages(int rank) const;
};

// Lowers `schedule`. InvalidArgument (with the step x rank grid and the
// offending cell marked) if an action is out of range or on the wrong rank,
// or if the per-rank orders cannot all make progress (a compute waits for an
// input that is never produced, e.g. B before its F, or a cycle across ranks).
absl::StatusOr<LoweredProgram> Lower(const Schedule& schedule, const LoweringOptions& options = {});

// `schedule`'s facts (name, sizes, forward_only, vocab_parallel and
// vocab_barriers, placement)
// in a program without actions; and back: a schedule of `program`'s facts
// whose ranks are the program's action lists (what the memory planner and
// the simulator read of a lowered program).
LoweredProgram EmptyProgramOf(const Schedule& schedule);
Schedule ScheduleOf(const LoweredProgram& program);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_IR_LOWERING_H_
