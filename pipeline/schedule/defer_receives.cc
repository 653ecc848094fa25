#include "pipeline/schedule/defer_receives.h"

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
      if (a.type == ActionType::kRecvForward || a.type == ActionType::kRecvBackward) {
        deferred.push_back(a);
        continue;
      }
      if (a.type == ActionType::kForward && a.stage > 0) {
        const Action needed{a.stage, ActionType::kRecvForward, a.microbatch};
        flush_until(&needed);
      } else if ((a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput) &&
                 a.stage < last) {
        const Action needed{a.stage, ActionType::kRecvBackward, a.microbatch};
        flush_until(&needed);
      } else if (IsTail(a.type)) {
        flush_until(nullptr);
      }
      reordered.push_back(a);
    }
    flush_until(nullptr);
    actions = std::move(reordered);
  }
  return out;
}

}  // namespace pp
