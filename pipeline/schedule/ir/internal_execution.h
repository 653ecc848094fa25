// Internal to the validator and simulator targets: executes a LoweredProgram
// with blocking (rendezvous) or buffered point-to-point semantics and
// collective tail actions. Checks that
// every compute's inputs are present when it runs and that no rank waits
// forever; times every action with the given costs.
#ifndef PIPELINE_SCHEDULE_IR_INTERNAL_EXECUTION_H_
#define PIPELINE_SCHEDULE_IR_INTERNAL_EXECUTION_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/schedule/ir/lowering.h"

namespace pp {
namespace internal_schedule {

struct ExecutionCosts {
  // Duration of a leaf compute action (F, B, I, W, and the vocabulary passes
  // OUT_S, OUT_T, IN_F, IN_B); an OVERLAP_F_B takes the sum of its halves'
  // (run back to back).
  std::function<double(const Action&)> compute;
  // Duration of tail action `a` on `rank` once its collective (if any) has
  // gathered; null: tail actions take no time.
  std::function<double(int rank, const Action& a)> tail;
  // The ranks that take part in tail action `a` of `rank` (including `rank`):
  // the action starts on all of them at the latest arrival (max of their
  // clocks), then each takes its tail() time. Every participant's program
  // must reach the same action (type and stage), and the function must give
  // every participant the same set. Null, empty or {rank}: local.
  std::function<std::vector<int>(int rank, const Action& a)> participants;
  // Duration of vocabulary collective `a` on `rank` once every rank is there
  // (they always involve all ranks); null: none.
  std::function<double(int rank, const Action& a)> vocab_collective;
  // false: a vocabulary collective blocks each rank from its arrival until
  // every rank is there and it has run. true: each rank posts it (a span of
  // no time) and goes on; it completes at the latest post plus its duration,
  // and a rank waits for that only where it reads the result (OUT_S after
  // OUT_BCAST, OUT_T and the one-barrier OUT_REDUCE after OUT_STATS, IN_B
  // after IN_BCAST, stage 0's F after IN_REDUCE, the last stage's B or I
  // after OUT_REDUCE) and before its tail (every collective it posted). A
  // program that runs with blocking collectives runs so too: each wait is
  // at or after the point where the blocking form waited.
  bool async_vocab_collectives = false;
  // Time a SEND occupies its rank (the sender's hand-off) before the message
  // leaves; null: none.
  std::function<double(int rank, const Action& a)> send;
  // Time a RECV occupies its rank once the message is there (unpacking it);
  // null: none.
  std::function<double(int rank, const Action& a)> recv;
  double message_latency = 0;
  // true: a SEND waits for its RECV and both complete together (rendezvous),
  // at max(ready) + send time + latency + receive time.
  // false: a SEND returns after its send time (buffered, like an isend waited
  // on later); its RECV completes at max(recv posted, SEND end + latency) +
  // receive time.
  bool blocking_sends = true;
};

struct Execution {
  // Indexed [rank][position in program.ranks[rank]]. A message's span is its
  // transfer (latency), not the time a rank waited for its peer.
  std::vector<std::vector<double>> start, end;
  // With async_vocab_collectives, indexed as start: when the vocabulary
  // collective an action posted completed (-1 for every other action); empty
  // without.
  std::vector<std::vector<double>> completed;
};

// InvalidArgument, with the step x rank grid of the program and the offending
// cell marked, on: an action out of range or on the wrong rank, a message to
// the own rank, a compute whose input has not arrived, a send of something
// not yet computed, or a deadlock (every unfinished rank waits on a peer that
// waits elsewhere, or in a collective that a participant never reaches).
absl::StatusOr<Execution> Execute(const LoweredProgram& program, const ExecutionCosts& costs);

}  // namespace internal_schedule
}  // namespace pp

#endif  // PIPELINE_SCHEDULE_IR_INTERNAL_EXECUTION_H_
