// Which ranks of a schedule cannot compute while a given compute action runs,
// from the schedule alone: a peer is idle throughout action X when each of its
// compute actions either must end before X starts or cannot start before X
// ends, because the data dependencies between compute actions (lowering.h's
// rule: F after the previous stage's F, B after the next stage's B, OUT_T after
// every OUT_S, ...) and each rank's own order chain them to X. Collectives and
// the time actions take are left out; they only add order, so a peer found idle
// is idle in every run of the schedule, whatever the costs.
//
// The runtime uses it on the CPU to lend a rank, for such an action, the cores
// of the idle ranks on its machine (pipeline/runtime/idle_core_threads.h): the
// first stage's first F and last B of 1F1B, the warm-up and cool-down of every
// schedule.
#ifndef PIPELINE_SCHEDULE_IR_IDLE_PEERS_H_
#define PIPELINE_SCHEDULE_IR_IDLE_PEERS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

// For each position i of schedule.ranks[rank]: the ranks of `peers` (in the
// order given) idle throughout that action. InvalidArgument when `rank` or a
// peer is out of range, a peer is `rank` or given twice, or the schedule's
// compute order cannot run (as Lower() reports it).
absl::StatusOr<std::vector<std::vector<int>>> IdlePeersDuring(const Schedule& schedule, int rank,
                                                              const std::vector<int>& peers);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_IR_IDLE_PEERS_H_
