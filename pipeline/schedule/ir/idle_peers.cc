#include "pipeline/schedule/ir/idle_peers.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "pipeline/schedule/ir/internal_dependencies.h"

namespace pp {

using internal_schedule::ComputeTiming;
using internal_schedule::Dependency;

absl::StatusOr<std::vector<std::vector<int>>> IdlePeersDuring(const Schedule& schedule, int rank,
                                                              const std::vector<int>& peers) {
  const int p = static_cast<int>(schedule.ranks.size());
  if (rank < 0 || rank >= p) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is out of range for a schedule of ", p, " ranks"));
  }
  // slot[q]: q's index in `peers` (a dimension of the clocks below), or -1.
  std::vector<int> slot(p, -1);
  for (int j = 0; j < static_cast<int>(peers.size()); ++j) {
    const int q = peers[j];
    if (q < 0 || q >= p || q == rank || slot[q] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("peer ", q, " must be a rank in [0, ", p,
                                                     ") other than ", rank, ", given once"));
    }
    slot[q] = j;
  }
  PP_ASSIGN_OR_RETURN(ComputeTiming timing,
                      internal_schedule::TimeComputeOrder(schedule, /*costs=*/{}));

  // Every compute action once, flat: index offset[r] + i.
  std::vector<int> offset(p + 1, 0);
  for (int r = 0; r < p; ++r) {
    offset[r + 1] = offset[r] + static_cast<int>(schedule.ranks[r].size());
  }
  const int n = offset[p];
  // A topological order: every cost is at least 1, so a producer (and the
  // previous action of the rank) starts strictly before its consumer.
  std::vector<std::tuple<int, int, int>> order;  // (start, rank, position)
  order.reserve(n);
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < static_cast<int>(schedule.ranks[r].size()); ++i) {
      order.emplace_back(timing.start[r][i], r, i);
    }
  }
  std::sort(order.begin(), order.end());
  std::vector<std::vector<int>> consumers(n);
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < static_cast<int>(schedule.ranks[r].size()); ++i) {
      for (const Dependency& d : timing.deps[r][i])
        consumers[offset[d.rank] + d.pos].push_back(offset[r] + i);
    }
  }

  // Vector clocks over the peers. before[x * k + j]: the last position of
  // peer j's list that happens before action x (or is x), -1 for none.
  // after[x * k + j]: the first position of peer j's list that x happens
  // before (or is x), its list's size for none.
  const int k = static_cast<int>(peers.size());
  std::vector<int> before(static_cast<size_t>(n) * k, -1);
  std::vector<int> after(static_cast<size_t>(n) * k);
  for (int x = 0; x < n; ++x) {
    for (int j = 0; j < k; ++j) {
      after[static_cast<size_t>(x) * k + j] = static_cast<int>(schedule.ranks[peers[j]].size());
    }
  }
  auto merge = [&](std::vector<int>& clock, int into, int from, bool take_max) {
    int* dst = clock.data() + static_cast<size_t>(into) * k;
    const int* src = clock.data() + static_cast<size_t>(from) * k;
    for (int j = 0; j < k; ++j)
      dst[j] = take_max ? std::max(dst[j], src[j]) : std::min(dst[j], src[j]);
  };
  for (const auto& [start, r, i] : order) {
    const int x = offset[r] + i;
    if (i > 0) merge(before, x, x - 1, /*take_max=*/true);
    for (const Dependency& d : timing.deps[r][i]) {
      merge(before, x, offset[d.rank] + d.pos, /*take_max=*/true);
    }
    if (slot[r] >= 0) before[static_cast<size_t>(x) * k + slot[r]] = i;
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const auto& [start, r, i] = *it;
    const int x = offset[r] + i;
    if (i + 1 < static_cast<int>(schedule.ranks[r].size())) {
      merge(after, x, x + 1, /*take_max=*/false);
    }
    for (int c : consumers[x]) merge(after, x, c, /*take_max=*/false);
    if (slot[r] >= 0) after[static_cast<size_t>(x) * k + slot[r]] = i;
  }

  // Idle: nothing of the peer's list falls between the last action before
  // and the first after.
  std::vector<std::vector<int>> idle(schedule.ranks[rank].size());
  for (int i = 0; i < static_cast<int>(idle.size()); ++i) {
    const size_t x = static_cast<size_t>(offset[rank] + i) * k;
    for (int j = 0; j < k; ++j) {
      if (after[x + j] == before[x + j] + 1) idle[i].push_back(peers[j]);
    }
  }
  return idle;
}

}  // namespace pp
