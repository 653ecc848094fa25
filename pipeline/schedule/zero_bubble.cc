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
#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/registry.h"

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

absl::StatusOr<Schedule> MakeZbH2(const ScheduleOptions& options) {
  return MakeZeroBubble(
      "zb_h2", options, [](int p, int r) { return 2 * (p - 1 - r); },
      [](int, int r) { return 2 * r; });
}

}  // namespace

PP_REGISTER_SCHEDULE("zb_h1",
                     "zero bubble H1 (I/W split): 1F1B's memory, a third of its bubble at F=I=W",
                     MakeZbH1);
PP_REGISTER_SCHEDULE("zb_h2",
                     "zero bubble H2 (I/W split): 2p-1 activations, no idle inside a rank's span",
                     MakeZbH2);

}  // namespace pp
