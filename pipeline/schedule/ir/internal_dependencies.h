// Internal to the lowering target: the data dependencies between compute
// actions of a Schedule and their list-scheduled timing (rule step 1 in
// lowering.h). Reports out-of-range, misplaced, duplicated and unreachable
// actions with the step x rank grid.
#ifndef PIPELINE_SCHEDULE_IR_INTERNAL_DEPENDENCIES_H_
#define PIPELINE_SCHEDULE_IR_INTERNAL_DEPENDENCIES_H_

#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {
namespace internal_schedule {

struct DependencyCosts {
  int forward = 1;
  int backward = 2;
  int backward_input = 1;
  int backward_weight = 1;
  int vocab = 1;  // each vocabulary pass (OUT_S, OUT_T, IN_F, IN_B)
};

// A producer of an input: the action at ranks[rank][pos]; `produced` is the
// leaf (an OVERLAP_F_B's half, or the action itself) that produces it.
struct Dependency {
  int rank;
  int pos;
  Action produced;
};

struct ComputeTiming {
  // Indexed [rank][position in schedule.ranks[rank]]. An OVERLAP_F_B is one
  // position: its deps are both halves' and it costs F + B (or I), run back
  // to back.
  std::vector<std::vector<int>> start, end;
  std::vector<std::vector<std::vector<Dependency>>> deps;
};

absl::StatusOr<ComputeTiming> TimeComputeOrder(const Schedule& schedule,
                                               const DependencyCosts& costs);

}  // namespace internal_schedule
}  // namespace pp

#endif  // PIPELINE_SCHEDULE_IR_INTERNAL_DEPENDENCIES_H_
