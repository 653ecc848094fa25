// Internal to the validator and simulator targets: executes a LoweredProgram
// with blocking (rendezvous) point-to-point semantics: a SEND and its RECV
// complete together, only when both ranks have reached them. Checks that
// every compute's inputs are present when it runs and that no rank waits
// forever; times every action with the given costs.
#ifndef PIPELINE_SCHEDULE_INTERNAL_EXECUTION_H_
#define PIPELINE_SCHEDULE_INTERNAL_EXECUTION_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/schedule/lowering.h"

namespace pp {
namespace internal_schedule {

struct ExecutionCosts {
  // Duration of a leaf compute action (F, B, I, W); an OVERLAP_F_B takes the
  // sum of its halves' (run back to back); tail actions take no time.
  std::function<double(const Action&)> compute;
  double message_latency = 0;
  // true: a SEND waits for its RECV and both complete together (rendezvous).
  // false: a SEND returns at once (buffered, like an isend waited on later);
  // its RECV completes at max(recv posted, send time + latency).
  bool blocking_sends = true;
};

struct Execution {
  // Indexed [rank][position in program.ranks[rank]]. A message's span is its
  // transfer (latency), not the time a rank waited for its peer.
  std::vector<std::vector<double>> start, end;
};

// InvalidArgument, with the step x rank grid of the program and the offending
// cell marked, on: an action out of range or on the wrong rank, a message to
// the own rank, a compute whose input has not arrived, a send of something
// not yet computed, or a deadlock (every unfinished rank waits on a peer that
// waits elsewhere).
absl::StatusOr<Execution> Execute(const LoweredProgram& program, const ExecutionCosts& costs);

}  // namespace internal_schedule
}  // namespace pp

#endif  // PIPELINE_SCHEDULE_INTERNAL_EXECUTION_H_
