// Looped breadth-first (Lamy-Poirier 2023; PyTorch's ScheduleLoopedBFS): v
// chunks per rank; all forwards of the lowest local stage for every
// micro-batch, then the next stage, ...; backwards visit the local stages in
// reverse, micro-batches descending. With v = 1 it is GPipe with reversed
// backwards. Any m >= 1, any v >= 1.
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

absl::StatusOr<Schedule> MakeLoopedBFS(const ScheduleOptions& options) {
  const int p = options.num_stages, m = options.num_microbatches, v = options.num_chunks;
  Schedule schedule = EmptyLoopedSchedule("looped_bfs", options);
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& actions = schedule.ranks[r];
    for (int c = 0; c < v; ++c) {
      for (int mb = 0; mb < m; ++mb) actions.push_back(F(c * p + r, mb));
    }
    for (int c = v - 1; c >= 0; --c) {
      for (int mb = m - 1; mb >= 0; --mb) actions.push_back(B(c * p + r, mb));
    }
  }
  return schedule;
}

}  // namespace

PP_REGISTER_SCHEDULE("looped_bfs",
                     "breadth-first over local chunks: all forwards of chunk 0, then chunk 1, ...",
                     MakeLoopedBFS);

}  // namespace pp
