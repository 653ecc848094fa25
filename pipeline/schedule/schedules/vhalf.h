// V-Half (Qi et al., "Pipeline Parallelism with Controllable Memory", arXiv
// 2405.15362): two chunks per rank in V placement (rank r holds virtual
// stages r and 2p - 1 - r), backward split into I and W, and less
// activation memory than 1F1B, half of it as p grows: p + 2 virtual-stage
// activations per rank at even p (p + 1 at odd p), where 1F1B's first rank
// and every rank of zbv hold 2p. Its price is a longer warm-up and cool-down
// than zbv's.
//
// Built as the paper builds it, on a grid of unit time slots:
//  1. The building block, repeated every 6 slots: on rank r micro-batch k's
//     F of chunk 0, F of chunk 1, I of chunk 1 and I of chunk 0 sit in slots
//     o + 6k with o = 2r, 3p - r - 2, 3p + g + 2r - 1, 6p + g - r - 2
//     (g = 3 at even p, else 0: the paper's V-Half block as its authors'
//     scheduler lays it out). The four offsets differ modulo 6 on every rank;
//     the two free slots of each period are for W.
//  2. W's fill the free slots, each after an I (oldest first).
//  3. Squeeze: in slot order, each action of the warm-up and of the cool-down
//     moves to the earliest free slot after its dependencies at which its
//     rank's peak memory (F +1, W -1) stays within the block's; the steady
//     state (from rank 0's first I of chunk 0 to the last micro-batch's first
//     forward) stays as laid out. Then once more without the W's (a pending
//     W runs in any free slot), which tightens the cool-down, and the W's are
//     placed again, chunk 1's first.
//  4. Each rank's order is its slots' order.
// One departure: with few micro-batches (m <= p + 1 at even p, m <= p at odd
// p) the last micro-batch's first forward comes before rank 0's first I, so
// the block has no steady state; the authors' code then never squeezes the
// cool-down, this squeezes it (within the same memory).
// Any m >= 1; every move keeps the dependencies, and the validator checks the
// result like any schedule's.
//
// MakeVHalf with a VHalfLayout other than the default is the block the
// paper's vocabulary-parallel V-Half builds on (vhalf_vocab_overlap,
// vocab_schedules.cc): each micro-batch's backward later by whole periods,
// and no squeeze.
#ifndef PIPELINE_SCHEDULE_SCHEDULES_VHALF_H_
#define PIPELINE_SCHEDULE_SCHEDULES_VHALF_H_

#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

struct VHalfLayout {
  // Added to g, so every I comes this many slots later (a multiple of the
  // period, 6: one micro-batch's activations more on every rank per period).
  int extra_gap = 0;
  // Step 3. Off: the block as laid out, W's in its free slots.
  bool squeeze = true;
};

// "vhalf" is MakeVHalf(options). With `slots`, (*slots)[r][i] is the grid
// slot of ranks[r][i] (step 4's order). InvalidArgument unless
// options.num_chunks is 2.
absl::StatusOr<Schedule> MakeVHalf(const ScheduleOptions& options, const VHalfLayout& layout = {},
                                   std::vector<std::vector<double>>* slots = nullptr);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_SCHEDULES_VHALF_H_
