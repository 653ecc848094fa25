// The schedule IR's atom: one action of one rank, in PyTorch pipelining's
// notation so that schedules can be exchanged with it.
//
//   <virtual stage><type><micro-batch>     0F3, 1B0, 2I1, 2W1, 1SEND_F3, 2RECV_B0
//   <virtual stage>REDUCE_GRAD             data-parallel gradient reduce of a stage
//   REDUCE_TIED, STEP                      rank-wide tail actions (no stage, no mb)
//   (0F3;3B1)OVERLAP_F_B                   a forward and a backward (B or I) of
//                                          two different micro-batches on one
//                                          rank, paired (DualPipeV)
//   OUT_S3, OUT_T3, IN_F3, IN_B3           vocabulary passes of a micro-batch,
//                                          on every rank (no stage); pipe's own,
//   OUT_BCAST3, OUT_STATS3, OUT_REDUCE3,   and their collectives over all
//   IN_REDUCE3, IN_BCAST3                  ranks; PyTorch's format has none
//
// A schedule (schedule.h) lists compute actions (F, B, I, W) per rank; the
// lowering pass (lowering.h) adds communication and the step's tail. Parsing
// and printing round-trip: ParseAction(ActionToString(a)) == a.
#ifndef PIPELINE_SCHEDULE_IR_ACTION_H_
#define PIPELINE_SCHEDULE_IR_ACTION_H_

#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pp {

enum class ActionType {
  // Compute. Listed by schedules.
  kForward,         // "F": forward of (stage, mb).
  kBackward,        // "B": full backward (input and weight gradients).
  kBackwardInput,   // "I": backward for input gradients only (B split).
  kBackwardWeight,  // "W": backward for weight gradients only (after I).
  // Communication. Inserted by Lower(); peers are always neighbouring virtual
  // stages (see PeerStage).
  kSendForward,   // "SEND_F": stage s sends its F output of mb to s + 1.
  kRecvForward,   // "RECV_F": stage s receives the F input of mb from s - 1.
  kSendBackward,  // "SEND_B": stage s sends its input gradient of mb to s - 1.
  kRecvBackward,  // "RECV_B": stage s receives the output gradient of mb from s + 1.
  // The step's tail. Inserted by Lower() after every compute/communication
  // action of a rank, in this order, only for training schedules.
  kReduceTiedGrads,  // "REDUCE_TIED": all-reduce the gradients of every tie
                     // group this rank belongs to (pipe axis), in key order.
  kReduceGrads,      // "<s>REDUCE_GRAD": all-reduce stage s's gradients across
                     // the data-parallel group.
  kOptimizerStep,    // "STEP": (clip and) apply the optimizer on this rank.
  // Compute, listed by schedules: "(<F>;<B or I>)OVERLAP_F_B", PyTorch's
  // _ComputationType.OVERLAP_F_B (torch/distributed/pipelining/schedules.py,
  // _Action.__repr__ / _Action.from_str): the forward of one micro-batch and
  // the backward of another, on one rank, that may run overlapped. Its halves
  // are the leaves (Leaves()); every analysis works on them, with the pair
  // occupying one position of the rank's list. Last, so that the dense
  // per-type tables of the leaf types (F, B, I, W first) keep their layout.
  kOverlapFB,
  // Vocabulary parallelism (arXiv 2411.05288): the input embedding and the
  // output layer are split by vocabulary rows over all pipeline ranks, and
  // each rank runs their passes for every micro-batch. No stage: the action
  // belongs to every rank's shard of the vocabulary. Listed by schedules
  // whose Schedule::vocab_parallel is set (vocab_passes.h places them).
  kVocabOutputS,  // "OUT_S": logits of this rank's rows and their softmax
                  // statistics (the paper's S pass).
  kVocabOutputT,  // "OUT_T": softmax, loss, the rows' weight gradient and
                  // this rank's share of the hidden state's gradient (T).
  kVocabInputF,   // "IN_F": this rank's rows of the embedding lookup.
  kVocabInputB,   // "IN_B": the weight gradient of this rank's rows.
  // Their collectives over all pipeline ranks, inserted by Lower():
  kVocabOutputBroadcast,  // "OUT_BCAST": the last stage's output (the head's
                          // input) from its rank to all (after its F).
  kVocabOutputStats,      // "OUT_STATS": all-gather of every rank's softmax
                          // statistics (after OUT_S, before OUT_T).
  kVocabOutputReduce,     // "OUT_REDUCE": sum of the hidden state's gradient
                          // shares onto the last stage's rank (before its B/I).
  kVocabInputReduce,      // "IN_REDUCE": sum of the embedding shares onto
                          // stage 0's rank (before its F).
  kVocabInputBroadcast,   // "IN_BCAST": the embedding output's gradient from
                          // stage 0's rank to all (after its B/I, before IN_B).
};

// The type's token: "F", "SEND_B", "REDUCE_TIED", ...
absl::string_view ActionTypeName(ActionType type);

bool IsCompute(ActionType type);          // F, B, I, W, OVERLAP_F_B
bool IsCommunication(ActionType type);    // SEND_*, RECV_*
bool IsReceive(ActionType type);          // RECV_F, RECV_B
bool IsTail(ActionType type);             // REDUCE_TIED, REDUCE_GRAD, STEP
bool IsVocabCompute(ActionType type);     // OUT_S, OUT_T, IN_F, IN_B
bool IsVocabCollective(ActionType type);  // OUT_BCAST, OUT_STATS, OUT_REDUCE,
                                          // IN_REDUCE, IN_BCAST
inline bool IsVocab(ActionType type) { return IsVocabCompute(type) || IsVocabCollective(type); }
// The vocabulary types in declaration order, OUT_S = 0 ... IN_BCAST = 8, for
// tables indexed by type (IsVocab(type) must hold).
constexpr int kNumVocabTypes = 9;
constexpr int VocabTypeIndex(ActionType type) {
  return static_cast<int>(type) - static_cast<int>(ActionType::kVocabOutputS);
}
static_assert(VocabTypeIndex(ActionType::kVocabInputBroadcast) == kNumVocabTypes - 1,
              "the vocabulary types are OUT_S ... IN_BCAST, in this order");
// Collectives a rank waits in with others: the tail and the vocabulary's.
inline bool IsCollective(ActionType type) { return IsTail(type) || IsVocabCollective(type); }
// Whether the string form carries a stage / a micro-batch.
bool HasStage(ActionType type);       // all but REDUCE_TIED, STEP and the vocabulary's
bool HasMicrobatch(ActionType type);  // compute, communication, vocabulary

// One action. `stage` is a virtual stage (chunk c on rank r with p ranks is
// c * p + r under the looped placement); -1 when the type has none, as is
// `microbatch`. For OVERLAP_F_B, `stage` and `microbatch` are the forward
// half's (so `stage` names the rank's stage like any compute action) and the
// backward_* fields the backward half's; they are -1 / kBackward otherwise.
// Plain value type.
struct Action {
  int stage = -1;
  ActionType type = ActionType::kForward;
  int microbatch = -1;
  int backward_stage = -1;
  ActionType backward_type = ActionType::kBackward;
  int backward_microbatch = -1;

  friend bool operator==(const Action& a, const Action& b) {
    return a.stage == b.stage && a.type == b.type && a.microbatch == b.microbatch &&
           a.backward_stage == b.backward_stage && a.backward_type == b.backward_type &&
           a.backward_microbatch == b.backward_microbatch;
  }
  friend bool operator!=(const Action& a, const Action& b) { return !(a == b); }
  friend bool operator<(const Action& a, const Action& b);
  template <typename H>
  friend H AbslHashValue(H h, const Action& a) {
    return H::combine(std::move(h), a.stage, static_cast<int>(a.type), a.microbatch,
                      a.backward_stage, static_cast<int>(a.backward_type), a.backward_microbatch);
  }
};

// Shorthands for building schedules: F(stage, mb), ...
inline Action F(int stage, int mb) { return {stage, ActionType::kForward, mb}; }
inline Action B(int stage, int mb) { return {stage, ActionType::kBackward, mb}; }
inline Action I(int stage, int mb) { return {stage, ActionType::kBackwardInput, mb}; }
inline Action W(int stage, int mb) { return {stage, ActionType::kBackwardWeight, mb}; }
// A vocabulary action of micro-batch mb (no stage): Vocab(kVocabOutputS, 3).
inline Action Vocab(ActionType type, int mb) { return {-1, type, mb}; }
// The vocabulary collective whose result the leaf action `leaf` reads, in a
// vocabulary-parallel program of `num_virtual_stages` stages whose output
// layer has `vocab_barriers` (1 or 2): stage 0's F reads IN_REDUCE, the last
// stage's B or I OUT_REDUCE, OUT_S OUT_BCAST, OUT_T (and with one barrier
// OUT_REDUCE, which rescales with it) OUT_STATS, IN_B IN_BCAST; nullopt for
// any other action. Where an asynchronous collective is waited for.
std::optional<Action> VocabCollectiveReadBy(const Action& leaf, int num_virtual_stages,
                                            int vocab_barriers);

// The pair "(<forward>;<backward>)OVERLAP_F_B". REQUIRES nothing: whether the
// halves form a valid pair (an F, then a B or I of another micro-batch) is
// CheckOverlapPair's, which ParseAction and the validator apply.
Action OverlapFB(const Action& forward, const Action& backward);
// The halves of an OVERLAP_F_B.
inline Action ForwardHalf(const Action& pair) { return F(pair.stage, pair.microbatch); }
inline Action BackwardHalf(const Action& pair) {
  return {pair.backward_stage, pair.backward_type, pair.backward_microbatch};
}
// OK if `forward` is an F and `backward` a B or I of a different micro-batch;
// else InvalidArgument saying which rule is broken.
absl::Status CheckOverlapPair(const Action& forward, const Action& backward);

// The leaf actions an action stands for, in execution order: the two halves
// of an OVERLAP_F_B, else the action itself. No allocation.
class Leaves {
 public:
  explicit Leaves(const Action& a);
  const Action* begin() const { return leaves_; }
  const Action* end() const { return leaves_ + size_; }
  int size() const { return size_; }

 private:
  Action leaves_[2];
  int size_ = 1;
};

// "1F3", "2RECV_B0", "0REDUCE_GRAD", "STEP", "(0F3;3B1)OVERLAP_F_B".
std::string ActionToString(const Action& action);
std::ostream& operator<<(std::ostream& os, const Action& action);

// Inverse of ActionToString. Malformed text (unknown type, missing or extra
// stage/micro-batch, negative or non-numeric parts, an OVERLAP_F_B whose
// halves are not an F and a B or I of another micro-batch) is
// InvalidArgument naming the text and the grammar.
absl::StatusOr<Action> ParseAction(absl::string_view text);

// Space- or comma-separated list of actions ("0F0 0F1,0B0"); empty tokens skipped.
absl::StatusOr<std::vector<Action>> ParseActions(absl::string_view text);
std::string ActionsToString(const std::vector<Action>& actions);  // space-separated

// The virtual stage at the other end of a communication action: SEND_F and
// RECV_B talk to stage + 1, RECV_F and SEND_B to stage - 1.
// REQUIRES: IsCommunication(action.type).
int PeerStage(const Action& action);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_IR_ACTION_H_
