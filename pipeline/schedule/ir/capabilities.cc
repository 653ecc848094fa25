#include "pipeline/schedule/ir/capabilities.h"

#include "absl/strings/str_cat.h"

namespace pp {

absl::Status CheckRuntimeSupports(const LoweredProgram& program,
                                  const RuntimeCapabilities& capabilities) {
  for (size_t rank = 0; rank < program.ranks.size(); ++rank) {
    for (const Action& action : program.ranks[rank]) {
      if (IsVocab(action.type) && !capabilities.vocab_parallel) {
        return absl::UnimplementedError(absl::StrCat(
            "schedule '", program.schedule_name, "' uses ", ActionToString(action), " on rank ",
            rank,
            ": vocabulary parallelism (the embedding and the head split over all pipeline "
            "ranks) is not executed by this runtime yet (issue #40: the schedules, validator "
            "and simulator have it, the stage executor does not); use a schedule without "
            "vocabulary passes"));
      }
      if (action.type == ActionType::kOverlapFB && !capabilities.overlap_f_b) {
        return absl::UnimplementedError(absl::StrCat(
            "schedule '", program.schedule_name, "' uses ", ActionToString(action), " on rank ",
            rank,
            ": OVERLAP_F_B (paired forward and backward, DualPipeV) is not implemented by "
            "the runtime; use a schedule without it"));
      }
      for (const Action& a : Leaves(action)) {
        const bool split =
            a.type == ActionType::kBackwardInput || a.type == ActionType::kBackwardWeight;
        if (split && !capabilities.split_backward) {
          return absl::UnimplementedError(absl::StrCat(
              "schedule '", program.schedule_name, "' uses ", ActionToString(a), " on rank ", rank,
              ": split backward (I/W, zero-bubble schedules) is not implemented by the runtime "
              "yet; use a schedule with full B actions"));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pp
