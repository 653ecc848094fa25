// Example of adding a schedule (walked through in examples/README.md, "Adding a
// schedule"): 1F1B with one extra warm-up forward per rank. The extra forward
// lets a rank start the next micro-batch while it waits for a gradient, at
// the cost of one more activation in flight (p - r + 1 instead of p - r).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

absl::StatusOr<Schedule> MakeEager1F1B(const ScheduleOptions& options) {
  if (options.num_chunks != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eager_1f1b places one chunk per rank: num_chunks (", options.num_chunks, ") must be 1"));
  }
  const int p = options.num_stages, m = options.num_microbatches;
  Schedule schedule = EmptyLoopedSchedule("eager_1f1b", options);
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& actions = schedule.ranks[r];
    const int warmup = std::min(p - r, m);  // 1F1B: p - 1 - r
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

PP_REGISTER_SCHEDULE("eager_1f1b", "1F1B with one extra warm-up forward per rank", MakeEager1F1B);

}  // namespace pp
