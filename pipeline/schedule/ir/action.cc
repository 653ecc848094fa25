#include "pipeline/schedule/ir/action.h"

#include <cctype>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pp {
namespace {

struct TypeToken {
  ActionType type;
  absl::string_view token;
};

constexpr TypeToken kTypeTokens[] = {
    {ActionType::kForward, "F"},
    {ActionType::kBackward, "B"},
    {ActionType::kBackwardInput, "I"},
    {ActionType::kBackwardWeight, "W"},
    {ActionType::kSendForward, "SEND_F"},
    {ActionType::kRecvForward, "RECV_F"},
    {ActionType::kSendBackward, "SEND_B"},
    {ActionType::kRecvBackward, "RECV_B"},
    {ActionType::kReduceTiedGrads, "REDUCE_TIED"},
    {ActionType::kReduceGrads, "REDUCE_GRAD"},
    {ActionType::kOptimizerStep, "STEP"},
    {ActionType::kOverlapFB, "OVERLAP_F_B"},
    {ActionType::kVocabOutputS, "OUT_S"},
    {ActionType::kVocabOutputT, "OUT_T"},
    {ActionType::kVocabInputF, "IN_F"},
    {ActionType::kVocabInputB, "IN_B"},
    {ActionType::kVocabOutputBroadcast, "OUT_BCAST"},
    {ActionType::kVocabOutputStats, "OUT_STATS"},
    {ActionType::kVocabOutputReduce, "OUT_REDUCE"},
    {ActionType::kVocabInputReduce, "IN_REDUCE"},
    {ActionType::kVocabInputBroadcast, "IN_BCAST"},
};

constexpr absl::string_view kGrammar =
    "expected <stage><F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B><microbatch> (e.g. "
    "1F3, 0RECV_B2), <stage>REDUCE_GRAD, REDUCE_TIED, STEP, "
    "(<stage>F<mb>;<stage><B|I><mb>)OVERLAP_F_B (e.g. (0F3;3B1)OVERLAP_F_B) or a "
    "vocabulary pass <OUT_S|OUT_T|IN_F|IN_B|OUT_BCAST|OUT_STATS|OUT_REDUCE|IN_REDUCE|"
    "IN_BCAST><microbatch> (e.g. OUT_S3)";

absl::Status Malformed(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed action \"", text, "\": ", why, "; ", kGrammar));
}

}  // namespace

absl::string_view ActionTypeName(ActionType type) {
  for (const TypeToken& t : kTypeTokens) {
    if (t.type == type) return t.token;
  }
  return "?";
}

bool IsCompute(ActionType type) {
  return type == ActionType::kForward || type == ActionType::kBackward ||
         type == ActionType::kBackwardInput || type == ActionType::kBackwardWeight ||
         type == ActionType::kOverlapFB;
}

Action OverlapFB(const Action& forward, const Action& backward) {
  Action pair{forward.stage, ActionType::kOverlapFB, forward.microbatch};
  pair.backward_stage = backward.stage;
  pair.backward_type = backward.type;
  pair.backward_microbatch = backward.microbatch;
  return pair;
}

absl::Status CheckOverlapPair(const Action& forward, const Action& backward) {
  if (forward.type != ActionType::kForward) {
    return absl::InvalidArgumentError(
        absl::StrCat("the first half of an OVERLAP_F_B must be an F, "
                     "got ",
                     ActionToString(forward)));
  }
  if (backward.type != ActionType::kBackward && backward.type != ActionType::kBackwardInput) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the second half of an OVERLAP_F_B must be a B or an I, got ", ActionToString(backward)));
  }
  if (forward.microbatch == backward.microbatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("the halves of an OVERLAP_F_B must be of different micro-batches, got ",
                     ActionToString(forward), " and ", ActionToString(backward)));
  }
  return absl::OkStatus();
}

Leaves::Leaves(const Action& a) {
  if (a.type == ActionType::kOverlapFB) {
    leaves_[0] = ForwardHalf(a);
    leaves_[1] = BackwardHalf(a);
    size_ = 2;
  } else {
    leaves_[0] = a;
  }
}

bool IsCommunication(ActionType type) {
  return type == ActionType::kSendForward || type == ActionType::kRecvForward ||
         type == ActionType::kSendBackward || type == ActionType::kRecvBackward;
}

bool IsReceive(ActionType type) {
  return type == ActionType::kRecvForward || type == ActionType::kRecvBackward;
}

bool IsTail(ActionType type) {
  return type == ActionType::kReduceTiedGrads || type == ActionType::kReduceGrads ||
         type == ActionType::kOptimizerStep;
}

bool IsVocabCompute(ActionType type) {
  return type == ActionType::kVocabOutputS || type == ActionType::kVocabOutputT ||
         type == ActionType::kVocabInputF || type == ActionType::kVocabInputB;
}

bool IsVocabCollective(ActionType type) {
  return type == ActionType::kVocabOutputBroadcast || type == ActionType::kVocabOutputStats ||
         type == ActionType::kVocabOutputReduce || type == ActionType::kVocabInputReduce ||
         type == ActionType::kVocabInputBroadcast;
}

std::optional<Action> VocabCollectiveReadBy(const Action& leaf, int num_virtual_stages,
                                            int vocab_barriers) {
  const int mb = leaf.microbatch;
  switch (leaf.type) {
    case ActionType::kForward:
      if (leaf.stage == 0) return Vocab(ActionType::kVocabInputReduce, mb);
      break;
    case ActionType::kBackward:
    case ActionType::kBackwardInput:
      if (leaf.stage == num_virtual_stages - 1) return Vocab(ActionType::kVocabOutputReduce, mb);
      break;
    case ActionType::kVocabOutputS:
      return Vocab(ActionType::kVocabOutputBroadcast, mb);
    case ActionType::kVocabOutputT:
      return Vocab(ActionType::kVocabOutputStats, mb);
    case ActionType::kVocabOutputReduce:
      if (vocab_barriers == 1) return Vocab(ActionType::kVocabOutputStats, mb);
      break;
    case ActionType::kVocabInputB:
      return Vocab(ActionType::kVocabInputBroadcast, mb);
    default:
      break;
  }
  return std::nullopt;
}

bool HasStage(ActionType type) {
  return type != ActionType::kReduceTiedGrads && type != ActionType::kOptimizerStep &&
         !IsVocab(type);
}

bool HasMicrobatch(ActionType type) {
  return IsCompute(type) || IsCommunication(type) || IsVocab(type);
}

bool operator<(const Action& a, const Action& b) {
  return std::make_tuple(a.stage, static_cast<int>(a.type), a.microbatch, a.backward_stage,
                         static_cast<int>(a.backward_type), a.backward_microbatch) <
         std::make_tuple(b.stage, static_cast<int>(b.type), b.microbatch, b.backward_stage,
                         static_cast<int>(b.backward_type), b.backward_microbatch);
}

std::string ActionToString(const Action& action) {
  std::string out;
  if (action.type == ActionType::kOverlapFB) {
    // PyTorch's _Action.__repr__ with sub_actions: "(" + ";".join(subs) + ")" + type.
    return absl::StrCat("(", ActionToString(ForwardHalf(action)), ";",
                        ActionToString(BackwardHalf(action)), ")OVERLAP_F_B");
  }
  if (HasStage(action.type)) absl::StrAppend(&out, action.stage);
  absl::StrAppend(&out, ActionTypeName(action.type));
  if (HasMicrobatch(action.type)) absl::StrAppend(&out, action.microbatch);
  return out;
}

std::ostream& operator<<(std::ostream& os, const Action& action) {
  return os << ActionToString(action);
}

absl::StatusOr<Action> ParseAction(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  if (s.empty()) return Malformed(text, "empty");
  if (s.front() == '(') {
    // PyTorch's _Action.from_str: "(" sub-actions separated by ";" ")" type.
    const size_t close = s.find(')');
    if (close == absl::string_view::npos) return Malformed(text, "no closing parenthesis");
    if (s.substr(close + 1) != "OVERLAP_F_B") {
      return Malformed(text, absl::StrCat("a parenthesised group must be followed by OVERLAP_F_B, "
                                          "got \"",
                                          s.substr(close + 1), "\""));
    }
    std::vector<absl::string_view> halves = absl::StrSplit(s.substr(1, close - 1), ';');
    if (halves.size() != 2) {
      return Malformed(text,
                       absl::StrCat("OVERLAP_F_B pairs exactly two actions, got ", halves.size()));
    }
    absl::StatusOr<Action> forward = ParseAction(halves[0]);
    if (!forward.ok()) return Malformed(text, forward.status().message());
    absl::StatusOr<Action> backward = ParseAction(halves[1]);
    if (!backward.ok()) return Malformed(text, backward.status().message());
    absl::Status pair = CheckOverlapPair(*forward, *backward);
    if (!pair.ok()) return Malformed(text, pair.message());
    return OverlapFB(*forward, *backward);
  }
  size_t i = 0;
  while (i < s.size() && absl::ascii_isdigit(s[i])) ++i;
  absl::string_view stage_text = s.substr(0, i);
  size_t j = i;
  while (j < s.size() && !absl::ascii_isdigit(s[j])) ++j;
  absl::string_view type_text = s.substr(i, j - i);
  absl::string_view mb_text = s.substr(j);
  Action action;
  bool found = false;
  for (const TypeToken& t : kTypeTokens) {
    if (t.token == type_text) {
      action.type = t.type;
      found = true;
    }
  }
  if (!found) {
    return Malformed(text, absl::StrCat("unknown type \"", type_text, "\""));
  }
  if (action.type == ActionType::kOverlapFB) {
    return Malformed(text, "OVERLAP_F_B is written (<forward>;<backward>)OVERLAP_F_B");
  }
  for (char c : mb_text) {
    if (!absl::ascii_isdigit(c)) {
      return Malformed(text, "trailing characters after the micro-batch");
    }
  }
  if (HasStage(action.type)) {
    if (stage_text.empty() || !absl::SimpleAtoi(stage_text, &action.stage)) {
      return Malformed(text, "missing or bad stage number");
    }
  } else if (!stage_text.empty()) {
    return Malformed(text, absl::StrCat(type_text, " takes no stage"));
  }
  if (HasMicrobatch(action.type)) {
    if (mb_text.empty() || !absl::SimpleAtoi(mb_text, &action.microbatch)) {
      return Malformed(text, "missing or bad micro-batch number");
    }
  } else if (!mb_text.empty()) {
    return Malformed(text, absl::StrCat(type_text, " takes no micro-batch"));
  }
  return action;
}

absl::StatusOr<std::vector<Action>> ParseActions(absl::string_view text) {
  std::vector<Action> out;
  for (absl::string_view token :
       absl::StrSplit(text, absl::ByAnyChar(" ,\t\n"), absl::SkipEmpty())) {
    absl::StatusOr<Action> action = ParseAction(token);
    if (!action.ok()) return action.status();
    out.push_back(*action);
  }
  return out;
}

std::string ActionsToString(const std::vector<Action>& actions) {
  return absl::StrJoin(actions, " ", [](std::string* out, const Action& a) {
    absl::StrAppend(out, ActionToString(a));
  });
}

int PeerStage(const Action& action) {
  switch (action.type) {
    case ActionType::kSendForward:
    case ActionType::kRecvBackward:
      return action.stage + 1;
    case ActionType::kRecvForward:
    case ActionType::kSendBackward:
      return action.stage - 1;
    default:
      return -1;
  }
}

}  // namespace pp
