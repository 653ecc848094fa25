// Forward-only schedule for evaluation: no backward, no tail. Each rank runs
// its local stages in order (chunk-major, like looped_bfs's forward half) and
// within a stage the micro-batches in order. Any m >= 1, any v >= 1.
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

absl::StatusOr<Schedule> MakeInference(const ScheduleOptions& options) {
  const int p = options.num_stages, m = options.num_microbatches, v = options.num_chunks;
  Schedule schedule = EmptyLoopedSchedule("inference", options);
  schedule.forward_only = true;
  for (int r = 0; r < p; ++r) {
    for (int c = 0; c < v; ++c) {
      for (int mb = 0; mb < m; ++mb) schedule.ranks[r].push_back(F(c * p + r, mb));
    }
  }
  return schedule;
}

}  // namespace

PP_REGISTER_SCHEDULE("inference", "forward only, micro-batches in order (evaluation)",
                     MakeInference);

}  // namespace pp
