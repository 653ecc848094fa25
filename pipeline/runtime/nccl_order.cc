#include "pipeline/runtime/nccl_order.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pp {
namespace {

bool IsSend(ActionType t) {
  return t == ActionType::kSendForward || t == ActionType::kSendBackward;
}

// The action of the peer's program that completes `a`.
Action Counterpart(const Action& a) {
  Action c;
  c.stage = PeerStage(a);
  c.microbatch = a.microbatch;
  switch (a.type) {
    case ActionType::kSendForward:
      c.type = ActionType::kRecvForward;
      break;
    case ActionType::kRecvForward:
      c.type = ActionType::kSendForward;
      break;
    case ActionType::kSendBackward:
      c.type = ActionType::kRecvBackward;
      break;
    default:
      c.type = ActionType::kSendBackward;
      break;
  }
  return c;
}

}  // namespace

absl::Status CheckPairwiseP2POrder(const LoweredProgram& program) {
  // ops[{a, b}]: rank a's transfers towards rank b, in program order.
  std::map<std::pair<int, int>, std::vector<Action>> ops;
  for (int r = 0; r < static_cast<int>(program.ranks.size()); ++r) {
    for (const Action& a : program.ranks[r]) {
      if (!IsCommunication(a.type)) continue;
      const int peer = program.PeerRank(a);
      if (peer == r) continue;
      ops[{r, peer}].push_back(a);
    }
  }
  std::set<std::pair<int, int>> pairs;  // (lower rank, higher rank)
  for (const auto& entry : ops) {
    pairs.insert({std::min(entry.first.first, entry.first.second),
                  std::max(entry.first.first, entry.first.second)});
  }
  static const std::vector<Action> kNone;
  auto of = [&](int from, int to) -> const std::vector<Action>& {
    auto it = ops.find({from, to});
    return it == ops.end() ? kNone : it->second;
  };
  for (const auto& [a, b] : pairs) {
    const std::vector<Action>& mine = of(a, b);
    const std::vector<Action>& theirs = of(b, a);
    const std::string where =
        absl::StrCat("schedule '", program.schedule_name, "' on NCCL: ranks ", a, " and ", b);
    size_t i = 0;
    for (; i < mine.size() && i < theirs.size(); ++i) {
      if (Counterpart(mine[i]) == theirs[i]) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          where, " post their transfers in different orders: transfer ", i + 1, " is ",
          ActionToString(mine[i]), " on rank ", a, " but ", ActionToString(theirs[i]), " on rank ",
          b, " (", IsSend(mine[i].type) && IsSend(theirs[i].type) ? "both send" : "not a pair",
          "; NCCL pairs the operations of two ranks by order, not by tag)"));
    }
    if (i < mine.size() || i < theirs.size()) {
      const bool a_left = i < mine.size();
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": ", ActionToString(a_left ? mine[i] : theirs[i]), " on rank ",
                       a_left ? a : b, " has no counterpart on rank ", a_left ? b : a));
    }
  }
  return absl::OkStatus();
}

}  // namespace pp
