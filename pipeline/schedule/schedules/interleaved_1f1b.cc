// Interleaved 1F1B (Megatron-LM's virtual pipeline, Narayanan et al. 2021):
// v chunks per rank (virtual stage c * p + r), micro-batches taken in groups
// of g (default p). Reproduces Megatron's order exactly:
//   table  = for each group [start, min(start + g, m)) (the last group takes
//            the remainder), for chunk c in 0..v-1, for mb in the group: (mb, c)
//   warmup = min(2 (p - 1 - r) + (v - 1) g, v m) forwards on rank r
//   forward step k  -> (table[k].mb, chunk table[k].c)
//   backward step k -> (table[k].mb, chunk v - 1 - table[k].c)
//   steady: F(k + warmup), B(k); cooldown: the remaining B(k).
// Megatron's group rule: p <= g <= m and (m % g == 0 or m % g >= p).
// v = 1 is accepted and follows the same rules (warm-up 2 (p - 1 - r));
// Megatron runs its non-interleaved schedule then, which is `1f1b` here.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

absl::StatusOr<Schedule> MakeInterleaved1F1B(const ScheduleOptions& options) {
  const int p = options.num_stages, m = options.num_microbatches, v = options.num_chunks;
  // m < p without a group size: one group of all m micro-batches, as
  // PyTorch's ScheduleInterleaved1F1B runs it (one round of m: its warm-up
  // (v - 1) m + 2 (p - 1 - r) and chunk switch every m ops are Megatron's
  // table with g = m).
  const bool one_round = options.group_size == 0 && m < p;
  const int g = options.group_size == 0 ? (one_round ? m : p) : options.group_size;
  if ((g < p && !one_round) || g > m || (m % g != 0 && m % g < p)) {
    return absl::InvalidArgumentError(
        absl::StrCat("interleaved_1f1b needs p <= g <= m and (m % g == 0 or m % g >= p) "
                     "(Megatron's group rule; with m < p and no group size, one group of m), "
                     "got p=",
                     p, ", m=", m, ", g=", g, options.group_size == 0 ? " (default g = p)" : "",
                     ", m % g = ", g > 0 ? m % g : 0));
  }
  // (mb, chunk) in Megatron's table order.
  std::vector<std::pair<int, int>> table;
  for (int start = 0; start < m; start += g) {
    // The last group takes the remainder (Megatron: start + g >= m).
    const int end = start + g >= m ? m : start + g;
    for (int c = 0; c < v; ++c) {
      for (int mb = start; mb < end; ++mb) table.push_back({mb, c});
    }
    if (end == m) break;
  }
  const int total = v * m;
  Schedule schedule = EmptyLoopedSchedule("interleaved_1f1b", options);
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& actions = schedule.ranks[r];
    auto forward = [&](int k) { actions.push_back(F(table[k].second * p + r, table[k].first)); };
    auto backward = [&](int k) {
      actions.push_back(B((v - 1 - table[k].second) * p + r, table[k].first));
    };
    const int warmup = std::min(2 * (p - 1 - r) + (v - 1) * g, total);
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = 0; k < total - warmup; ++k) {
      forward(k + warmup);
      backward(k);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  }
  return schedule;
}

}  // namespace

PP_REGISTER_SCHEDULE("interleaved_1f1b",
                     "Megatron's interleaved 1F1B: v chunks per rank, groups of g micro-batches",
                     MakeInterleaved1F1B);

}  // namespace pp
