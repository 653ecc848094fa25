#include "pipeline/schedule/ir/defer_receives.h"

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

namespace pp {

LoweredProgram DeferReceives(const LoweredProgram& program) {
  LoweredProgram out = program;
  const int last = program.num_virtual_stages() - 1;
  for (std::vector<Action>& actions : out.ranks) {
    std::vector<Action> reordered;
    std::deque<Action> deferred;
    auto flush_until = [&](const Action* needed) {
      if (needed != nullptr &&
          std::find(deferred.begin(), deferred.end(), *needed) == deferred.end())
        return;
      while (!deferred.empty()) {
        const Action r = deferred.front();
        deferred.pop_front();
        reordered.push_back(r);
        if (needed != nullptr && r == *needed) return;
      }
    };
    for (const Action& a : actions) {
      if (IsReceive(a.type)) {
        deferred.push_back(a);
        continue;
      }
      // Both halves of an OVERLAP_F_B: their receives come before the pair.
      for (const Action& leaf : Leaves(a)) {
        if (leaf.type == ActionType::kForward && leaf.stage > 0) {
          const Action needed{leaf.stage, ActionType::kRecvForward, leaf.microbatch};
          flush_until(&needed);
        } else if ((leaf.type == ActionType::kBackward ||
                    leaf.type == ActionType::kBackwardInput) &&
                   leaf.stage < last) {
          const Action needed{leaf.stage, ActionType::kRecvBackward, leaf.microbatch};
          flush_until(&needed);
        } else if (IsTail(leaf.type)) {
          flush_until(nullptr);
        }
      }
      reordered.push_back(a);
    }
    flush_until(nullptr);
    actions = std::move(reordered);
  }
  return out;
}

}  // namespace pp
