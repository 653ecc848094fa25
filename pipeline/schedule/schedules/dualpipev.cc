// DualPipeV (DeepSeek-V3 technical report, arXiv 2412.19437, section 3.2.1,
// and deepseek-ai/DualPipe's dualpipev.py): the "cut in half" DualPipe. Two
// chunks per rank in V placement (rank r holds virtual stages r and
// 2p - 1 - r; VPlacement in schedule.h), and in its main phase every step
// pairs the forward of one micro-batch with the backward of another on the
// same rank (OVERLAP_F_B), which DualPipe overlaps to hide communication.
//
// The order is PyTorch's, exactly: ScheduleDualPipeV in
// torch/distributed/pipelining/schedules.py (PyTorch 2.9 onwards; in the
// copy we read the class begins about 93.3k characters into the file, its
// _calculate_single_rank_operations about 2k further). Its rules, restated:
//   - exactly 2 local stages (else ValueError) and m >= 2p micro-batches
//     ("DualPipeV requires at least as many microbatches as stages": the
//     stage count there is the global one, 2p);
//   - counters per (stage, F) and (stage, I); a full B uses and advances the
//     stage's I counter (add_action / increment_backward_counts); every I
//     appends (stage, mb) to a FIFO weight queue, and "W" pops its head
//     (add_weight_action_if_pending: nothing when the queue is empty);
//   - rank r, s0 = r, s1 = 2p - 1 - r:
//     1. 2(p - r - 1) x F(s0)
//     2. (r + 1) x [F(s0), F(s1)]
//     3. (p - r - 1) x [I(s1), W, F(s1)]
//     4. (m - 2p + r + 1) x [OVERLAP(F(s0), B(s1)), OVERLAP(F(s1), B(s0))],
//        except that on the last rank (r = p - 1) the first of the two pairs
//        of the first iteration is F(s0), B(s1) unpaired ("we don't overlap
//        these two chunks to further reduce bubble size")
//     5. (p - r - 1) x [B(s1), OVERLAP(F(s1), B(s0))]
//     6. (r + 1) x [X(s1), X(s0)] with X = B until iteration (r + 1) / 2,
//        I from then on; on odd ranks the switch happens before that
//        iteration's s1 action, on even ranks between its s1 and s0 actions
//     7. (p - r - 1) x [W, X(s0)] (X as left by step 6: I on every rank)
//     8. (r + 1) x W
// PyTorch emits no idle cells here; our lowering and simulator derive the
// timing from dependencies anyway.
#include <deque>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

// One rank's generator state: the counters and the W queue of
// _calculate_single_rank_operations.
class RankOps {
 public:
  explicit RankOps(std::vector<Action>* out) : out_(out) {}

  // add_action: F, I or B of `stage` (B counted on the I counter).
  void Add(ActionType type, int stage) { out_->push_back(Next(type, stage)); }
  // add_overlap_f_b: F of `forward_stage` paired with B of `backward_stage`.
  void AddOverlap(int forward_stage, int backward_stage) {
    const Action f = Next(ActionType::kForward, forward_stage);
    const Action b = Next(ActionType::kBackward, backward_stage);
    out_->push_back(OverlapFB(f, b));
  }
  // add_weight_action_if_pending.
  void AddWeightIfPending() {
    if (weights_.empty()) return;
    out_->push_back(W(weights_.front().first, weights_.front().second));
    weights_.pop_front();
  }

 private:
  Action Next(ActionType type, int stage) {
    const bool forward = type == ActionType::kForward;
    int& counter = forward ? forward_[stage] : backward_[stage];
    const int mb = counter++;
    if (type == ActionType::kBackwardInput) weights_.push_back({stage, mb});
    return {stage, type, mb};
  }

  std::vector<Action>* out_;
  std::map<int, int> forward_, backward_;
  std::deque<std::pair<int, int>> weights_;
};

absl::StatusOr<Schedule> MakeDualPipeV(const ScheduleOptions& options) {
  const int p = options.num_stages, m = options.num_microbatches;
  if (options.num_chunks != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("dualpipev places exactly two chunks per rank (a V): num_chunks (",
                     options.num_chunks, ") must be 2"));
  }
  if (m < 2 * p) {
    return absl::InvalidArgumentError(
        absl::StrCat("dualpipev needs at least as many micro-batches as stages (PyTorch's "
                     "ScheduleDualPipeV rule): num_microbatches (",
                     m, ") must be >= 2 * num_stages = ", 2 * p));
  }
  Schedule schedule = EmptyLoopedSchedule("dualpipev", options);
  schedule.stage_to_rank = VPlacement(p);
  for (int r = 0; r < p; ++r) {
    const int s0 = r, s1 = 2 * p - 1 - r;
    RankOps ops(&schedule.ranks[r]);
    for (int k = 0; k < 2 * (p - r - 1); ++k) ops.Add(ActionType::kForward, s0);
    for (int k = 0; k < r + 1; ++k) {
      ops.Add(ActionType::kForward, s0);
      ops.Add(ActionType::kForward, s1);
    }
    for (int k = 0; k < p - r - 1; ++k) {
      ops.Add(ActionType::kBackwardInput, s1);
      ops.AddWeightIfPending();
      ops.Add(ActionType::kForward, s1);
    }
    for (int k = 0; k < m - 2 * p + r + 1; ++k) {
      if (k == 0 && r == p - 1) {
        ops.Add(ActionType::kForward, s0);
        ops.Add(ActionType::kBackward, s1);
      } else {
        ops.AddOverlap(s0, s1);
      }
      ops.AddOverlap(s1, s0);
    }
    for (int k = 0; k < p - r - 1; ++k) {
      ops.Add(ActionType::kBackward, s1);
      ops.AddOverlap(s1, s0);
    }
    const int step6 = r + 1;
    bool zero_bubble = false;
    auto backward_type = [&] {
      return zero_bubble ? ActionType::kBackwardInput : ActionType::kBackward;
    };
    for (int k = 0; k < step6; ++k) {
      if (k == step6 / 2 && r % 2 == 1) zero_bubble = true;
      ops.Add(backward_type(), s1);
      if (k == step6 / 2 && r % 2 == 0) zero_bubble = true;
      ops.Add(backward_type(), s0);
    }
    for (int k = 0; k < p - r - 1; ++k) {
      ops.AddWeightIfPending();
      ops.Add(backward_type(), s0);
    }
    for (int k = 0; k < r + 1; ++k) ops.AddWeightIfPending();
  }
  return schedule;
}

}  // namespace

PP_REGISTER_SCHEDULE("dualpipev",
                     "DualPipeV (PyTorch's ScheduleDualPipeV): 2 chunks per rank in V placement, "
                     "OVERLAP_F_B pairs, m >= 2p",
                     MakeDualPipeV);

}  // namespace pp
