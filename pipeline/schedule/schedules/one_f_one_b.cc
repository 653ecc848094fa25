// 1F1B (PipeDream-Flush; DeepSpeed's TrainSchedule; Megatron's
// non-interleaved schedule): rank r runs min(p - 1 - r, m) warm-up forwards,
// then alternates one forward and one backward, then drains the remaining
// backwards. At most p - r activations in flight on rank r. Any m >= 1.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

absl::StatusOr<Schedule> Make1F1B(const ScheduleOptions& options) {
  if (options.num_chunks != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("1f1b places one chunk per rank: num_chunks (", options.num_chunks,
                     ") must be 1; use interleaved_1f1b for several chunks"));
  }
  const int p = options.num_stages, m = options.num_microbatches;
  Schedule schedule = EmptyLoopedSchedule("1f1b", options);
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& actions = schedule.ranks[r];
    const int warmup = std::min(p - 1 - r, m);
    for (int mb = 0; mb < warmup; ++mb) actions.push_back(F(r, mb));
    for (int i = 0; i < m - warmup; ++i) {
      actions.push_back(F(r, warmup + i));
      actions.push_back(B(r, i));
    }
    for (int mb = m - warmup; mb < m; ++mb) actions.push_back(B(r, mb));
  }
  return schedule;
}

}  // namespace

PP_REGISTER_SCHEDULE("1f1b",
                     "one forward one backward (PipeDream-Flush), p - r activations in flight",
                     Make1F1B);

}  // namespace pp
