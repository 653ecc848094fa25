// ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241,
// section 6): two chunks per rank in V placement (rank r holds virtual stages
// r and 2p - 1 - r, so the bottom of the V, stages p - 1 and p, is on rank
// p - 1 and hands over locally), backward split into I and W.
//
// The order is PyTorch's, exactly: ScheduleZBVZeroBubble.
// _calculate_single_rank_operations in torch/distributed/pipelining/
// schedules.py (PyTorch 2.6 onwards; in the copy we read the method begins
// about 85.4k characters into the file). Rank r, chunk 0 = stage r, chunk 1 =
// stage 2p - 1 - r, with n = max(2p - 1, m) micro-batches generated and every
// action of a micro-batch >= m dropped afterwards (PyTorch replaces them with
// idle cells; the `r` idle cells it puts at the start of rank r are timing,
// which our lowering and simulator derive from dependencies instead):
//   warm-up 1: 2(p - r) - 1 times F(chunk 0)
//   warm-up 2: r times F(chunk 1), F(chunk 0)
//   warm-up 3: p - r times F(chunk 1), I(chunk 1), W(chunk 1)
//   stable:    while F(chunk 1) count < F(chunk 0) count or F(chunk 0) count
//              < n: [F(chunk 0) if its count < n], I(chunk 0), W(chunk 0),
//              F(chunk 1), I(chunk 1), W(chunk 1)
//   cool-down: r times I(chunk 0), I(chunk 1); then p - r times I(chunk 0),
//              W(chunk 0) (the oldest W of chunk 0 not yet emitted); then the
//              remaining W's of chunk 1, then of chunk 0, oldest first.
// Each of F, I, W counts micro-batches per chunk from 0. PyTorch accepts any
// micro-batch count; so does this (2 chunks required, as in PyTorch).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

absl::StatusOr<Schedule> MakeZbv(const ScheduleOptions& options) {
  if (options.num_chunks != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("zbv places exactly two chunks per rank (a V): num_chunks (",
                     options.num_chunks, ") must be 2"));
  }
  const int p = options.num_stages, m = options.num_microbatches;
  Schedule schedule = EmptyLoopedSchedule("zbv", options);
  schedule.stage_to_rank = VPlacement(p);
  const int n = std::max(2 * p - 1, m);
  for (int r = 0; r < p; ++r) {
    const int s0 = r, s1 = 2 * p - 1 - r;
    std::vector<Action> ops;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    for (int k = 0; k < 2 * (p - r) - 1; ++k) ops.push_back(F(s0, f0++));
    for (int k = 0; k < r; ++k) {
      ops.push_back(F(s1, f1++));
      ops.push_back(F(s0, f0++));
    }
    for (int k = 0; k < p - r; ++k) {
      ops.push_back(F(s1, f1++));
      ops.push_back(I(s1, b1));
      ops.push_back(W(s1, b1++));
    }
    while (f1 < f0 || f0 < n) {
      if (f0 < n) ops.push_back(F(s0, f0++));
      ops.push_back(I(s0, b0));
      ops.push_back(W(s0, b0++));
      ops.push_back(F(s1, f1++));
      ops.push_back(I(s1, b1));
      ops.push_back(W(s1, b1++));
    }
    int w0 = b0, w1 = b1;
    for (int k = 0; k < r; ++k) {
      ops.push_back(I(s0, b0++));
      ops.push_back(I(s1, b1++));
    }
    for (int k = 0; k < p - r; ++k) {
      ops.push_back(I(s0, b0++));
      ops.push_back(W(s0, w0++));
    }
    while (w1 < b1) ops.push_back(W(s1, w1++));
    while (w0 < b0) ops.push_back(W(s0, w0++));
    for (const Action& a : ops) {
      if (a.microbatch < m) schedule.ranks[r].push_back(a);
    }
  }
  return schedule;
}

}  // namespace

PP_REGISTER_SCHEDULE("zbv",
                     "zero bubble V (PyTorch's ScheduleZBVZeroBubble): 2 chunks per rank in V "
                     "placement, I/W split",
                     MakeZbv);

}  // namespace pp
