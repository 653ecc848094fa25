// GPipe (Huang et al. 2019): every forward in micro-batch order, then every
// backward in micro-batch order. Peak in-flight activations: m per rank.
// One chunk per rank; any m >= 1 (m < p only lengthens the bubble).
#include "absl/strings/str_cat.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

absl::StatusOr<Schedule> MakeGPipe(const ScheduleOptions& options) {
  if (options.num_chunks != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpipe places one chunk per rank: num_chunks (", options.num_chunks,
                     ") must be 1; use looped_bfs for several chunks"));
  }
  Schedule schedule = EmptyLoopedSchedule("gpipe", options);
  for (int r = 0; r < options.num_stages; ++r) {
    for (int mb = 0; mb < options.num_microbatches; ++mb) {
      schedule.ranks[r].push_back(F(r, mb));
    }
    for (int mb = 0; mb < options.num_microbatches; ++mb) {
      schedule.ranks[r].push_back(B(r, mb));
    }
  }
  return schedule;
}

}  // namespace

PP_REGISTER_SCHEDULE("gpipe", "all forwards, then all backwards (m activations in flight)",
                     MakeGPipe);

}  // namespace pp
