// The zero-bubble paper's hand-crafted schedules (Qi et al., "Zero Bubble
// Pipeline Parallelism", ICLR 2024, arXiv 2401.10241, section 3.1 and
// Figure 3), with the backward split into I (input gradients, on the critical
// path) and W (weight gradients, movable). One chunk per rank.
//
// Both are 1F1B with I in place of B, more warm-up forwards and W passes held
// back to fill bubbles. Rank r of p, m micro-batches:
//   warm-up: min(warmup(r), m) forwards F0, F1, ...
//   steady:  for each remaining forward: F, I of the oldest forwarded
//            micro-batch, then W of the oldest micro-batch without W once
//            `delay(r)` I's are waiting for their W
//   cooldown: the remaining I's, each followed by a W under the same rule;
//            then every remaining W.
// This is PyTorch's `_get_1f1b_rank_ops` with `enable_zero_bubble` (W emitted
// once `op - warmup_ops >= num_1f1b_microbatches`), with the paper's warm-up
// and W delay per schedule:
//   zb_h1: warmup p - 1 - r (1F1B's), delay r. Rank r holds p activations not
//          yet freed by W, the most 1F1B holds on any rank (rank 0: p), so the
//          peak memory equals 1F1B's; with F = I = W the bubble is
//          (p - 1)(F + I - W), a third of 1F1B's (p - 1)(F + I + W).
//   zb_h2: warmup 2(p - 1 - r), delay 2r: every rank holds 2p - 1 activations
//          (twice 1F1B's memory) and, with F = I = W, never idles between its
//          first and last action (the paper's parallelogram; its bubble is
//          only the start offset r F, which the paper removes across steps by
//          dropping the optimizer-step barrier).
//          With m < 2p - 1 the parallelogram does not close and a rank idles
//          while waiting for a gradient; there the zero-bubble authors'
//          construction (their repository's ZB heuristic, `manual_order` in
//          megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py: while
//          a W ends no later than the next input arrives, put a W) fills the
//          wait with a pending W. Timed with F = I = W = 1 (the paper's
//          setting for H1/H2), this changes nothing where no rank idles
//          (m >= 2p - 1), and at p = 4, m = 4 it gives their ZB-2p's 15
//          instead of 16 (issue #27).
#include <algorithm>
#include <functional>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

absl::StatusOr<Schedule> MakeZeroBubble(const std::string& name, const ScheduleOptions& options,
                                        const std::function<int(int p, int r)>& warmup_of,
                                        const std::function<int(int p, int r)>& delay_of) {
  if (options.num_chunks != 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, " places one chunk per rank: num_chunks (",
                                                   options.num_chunks, ") must be 1"));
  }
  const int p = options.num_stages, m = options.num_microbatches;
  Schedule schedule = EmptyLoopedSchedule(name, options);
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& actions = schedule.ranks[r];
    const int warmup = std::min(warmup_of(p, r), m);
    const int delay = delay_of(p, r);
    int next_f = 0, next_i = 0, next_w = 0;
    while (next_f < warmup) actions.push_back(F(r, next_f++));
    while (next_i < m) {
      if (next_f < m) actions.push_back(F(r, next_f++));
      actions.push_back(I(r, next_i++));
      if (next_i - next_w > delay) actions.push_back(W(r, next_w++));
    }
    while (next_w < m) actions.push_back(W(r, next_w++));
  }
  return schedule;
}

absl::StatusOr<Schedule> MakeZbH1(const ScheduleOptions& options) {
  return MakeZeroBubble(
      "zb_h1", options, [](int p, int r) { return p - 1 - r; }, [](int, int r) { return r; });
}

// Re-times `schedule` (one chunk, F/I/W) with F = I = W = 1 and no message
// cost, keeping each rank's F and I order and its W delay rule, and starts a
// pending W whenever a rank would otherwise wait for an input (the authors'
// bubble filling).
Schedule FillWaitsWithW(Schedule schedule, const std::function<int(int p, int r)>& delay_of) {
  const int p = schedule.num_stages, m = schedule.num_microbatches;
  std::vector<std::vector<Action>> f_and_i(p);
  for (int r = 0; r < p; ++r) {
    for (const Action& a : schedule.ranks[r]) {
      if (a.type != ActionType::kBackwardWeight) f_and_i[r].push_back(a);
    }
  }
  constexpr int kNever = std::numeric_limits<int>::max();
  std::vector<std::vector<int>> f_end(p, std::vector<int>(m, kNever));
  std::vector<std::vector<int>> i_end(p, std::vector<int>(m, kNever));
  std::vector<size_t> pos(p, 0);
  std::vector<int> next_w(p, 0), done_i(p, 0);
  RankActions out(p);
  auto ready = [&](int r, const Action& a, int t) {
    if (a.type == ActionType::kForward) return r == 0 || f_end[r - 1][a.microbatch] <= t;
    return f_end[r][a.microbatch] <= t && (r == p - 1 || i_end[r + 1][a.microbatch] <= t);
  };
  for (int t = 0;; ++t) {
    bool all_done = true;
    for (int r = 0; r < p; ++r) {
      const bool order_left = pos[r] < f_and_i[r].size();
      const bool w_pending = next_w[r] < done_i[r];
      if (!order_left && next_w[r] == m) continue;
      all_done = false;
      const bool forced_w = w_pending && done_i[r] - next_w[r] > delay_of(p, r);
      if (!forced_w && order_left && ready(r, f_and_i[r][pos[r]], t)) {
        const Action a = f_and_i[r][pos[r]++];
        (a.type == ActionType::kForward ? f_end : i_end)[r][a.microbatch] = t + 1;
        if (a.type == ActionType::kBackwardInput) ++done_i[r];
        out[r].push_back(a);
      } else if (w_pending) {
        out[r].push_back(W(r, next_w[r]++));
      }
    }
    if (all_done) break;
  }
  schedule.ranks = std::move(out);
  return schedule;
}

absl::StatusOr<Schedule> MakeZbH2(const ScheduleOptions& options) {
  auto warmup = [](int p, int r) { return 2 * (p - 1 - r); };
  auto delay = [](int, int r) { return 2 * r; };
  absl::StatusOr<Schedule> schedule = MakeZeroBubble("zb_h2", options, warmup, delay);
  if (!schedule.ok() || options.num_microbatches >= 2 * options.num_stages - 1) return schedule;
  return FillWaitsWithW(*std::move(schedule), delay);
}

}  // namespace

PP_REGISTER_SCHEDULE("zb_h1",
                     "zero bubble H1 (I/W split): 1F1B's memory, a third of its bubble at F=I=W",
                     MakeZbH1);
PP_REGISTER_SCHEDULE("zb_h2",
                     "zero bubble H2 (I/W split): 2p-1 activations, no idle inside a rank's span",
                     MakeZbH2);

}  // namespace pp
