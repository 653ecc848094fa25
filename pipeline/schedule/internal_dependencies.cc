#include "pipeline/schedule/internal_dependencies.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pp {
namespace internal_schedule {
absl::StatusOr<ComputeTiming> TimeComputeOrder(const Schedule& schedule,
                                               const DependencyCosts& costs) {
  const int p = schedule.num_stages;
  const int num_virtual = static_cast<int>(schedule.stage_to_rank.size());
  const int m = schedule.num_microbatches;
  if (static_cast<int>(schedule.ranks.size()) != p) {
    return absl::InvalidArgumentError(absl::StrCat("schedule \"", schedule.name, "\" has ",
                                                   schedule.ranks.size(),
                                                   " rank lists for num_stages ", p));
  }
  // Where each compute (type, stage, mb) runs; dense, ranges checked first.
  std::vector<Dependency> where(4 * num_virtual * m, Dependency{-1, -1});
  auto key = [&](const Action& a) {
    return (static_cast<int>(a.type) * num_virtual + a.stage) * m + a.microbatch;
  };
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < static_cast<int>(schedule.ranks[r].size()); ++i) {
      PP_RETURN_IF_ERROR(CheckComputeCell(schedule, r, i));
      for (const Action& a : Leaves(schedule.ranks[r][i])) {
        Dependency& slot = where[key(a)];
        if (slot.rank >= 0) {
          const Dependency& first = slot;
          return ScheduleCellError(schedule, r, i,
                                   absl::StrCat(ActionToString(a),
                                                " appears twice (first "
                                                "at rank ",
                                                first.rank, " step ", first.pos, ")"));
        }
        slot = Dependency{r, i, a};
      }
    }
  }

  ComputeTiming timing;
  timing.start.resize(p);
  timing.end.resize(p);
  timing.deps.resize(p);
  for (int r = 0; r < p; ++r) {
    const auto& actions = schedule.ranks[r];
    timing.start[r].assign(actions.size(), -1);
    timing.end[r].assign(actions.size(), -1);
    timing.deps[r].resize(actions.size());
    for (int i = 0; i < static_cast<int>(actions.size()); ++i) {
      for (const Action& a : Leaves(actions[i])) {
        auto need = [&](std::vector<Action> alternatives) -> absl::Status {
          for (const Action& alt : alternatives) {
            const Dependency& found = where[key(alt)];
            if (found.rank >= 0) {
              timing.deps[r][i].push_back(found);
              return absl::OkStatus();
            }
          }
          std::string names;
          for (const Action& alt : alternatives) {
            absl::StrAppend(&names, names.empty() ? "" : " or ", ActionToString(alt));
          }
          return ScheduleCellError(
              schedule, r, i,
              absl::StrCat(ActionToString(a), " needs ", names, ", which no rank runs"));
        };
        absl::Status status;
        switch (a.type) {
          case ActionType::kForward:
            if (a.stage > 0) status = need({F(a.stage - 1, a.microbatch)});
            break;
          case ActionType::kBackward:
          case ActionType::kBackwardInput:
            status = need({F(a.stage, a.microbatch)});
            if (status.ok() && a.stage + 1 < num_virtual) {
              status = need({B(a.stage + 1, a.microbatch), I(a.stage + 1, a.microbatch)});
            }
            break;
          case ActionType::kBackwardWeight:
            status = need({I(a.stage, a.microbatch)});
            break;
          default:
            break;
        }
        if (!status.ok()) return status;
      }
    }
  }

  auto leaf_cost = [&](ActionType type) {
    switch (type) {
      case ActionType::kForward:
        return costs.forward;
      case ActionType::kBackward:
        return costs.backward;
      case ActionType::kBackwardInput:
        return costs.backward_input;
      default:
        return costs.backward_weight;
    }
  };
  auto cost = [&](const Action& action) {
    int total = 0;
    for (const Action& a : Leaves(action)) total += leaf_cost(a.type);
    return total;
  };
  std::vector<int> pos(p, 0), free_at(p, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (pos[r] < static_cast<int>(schedule.ranks[r].size())) {
        const int i = pos[r];
        int ready = free_at[r];
        bool blocked = false;
        for (const Dependency& d : timing.deps[r][i]) {
          if (timing.end[d.rank][d.pos] < 0) {
            blocked = true;
            break;
          }
          ready = std::max(ready, timing.end[d.rank][d.pos]);
        }
        if (blocked) break;
        timing.start[r][i] = ready;
        timing.end[r][i] = ready + cost(schedule.ranks[r][i]);
        free_at[r] = timing.end[r][i];
        ++pos[r];
        progress = true;
      }
    }
  }
  // Stuck ranks: report each one's wait; mark the first.
  std::string waits;
  int first_rank = -1;
  for (int r = 0; r < p; ++r) {
    if (pos[r] == static_cast<int>(schedule.ranks[r].size())) continue;
    const int i = pos[r];
    if (first_rank < 0) first_rank = r;
    for (const Dependency& d : timing.deps[r][i]) {
      if (timing.end[d.rank][d.pos] >= 0) continue;
      absl::StrAppend(&waits, "\n  rank ", r, " step ", i, ": ",
                      ActionToString(schedule.ranks[r][i]), " waits for ",
                      ActionToString(schedule.ranks[d.rank][d.pos]), " (rank ", d.rank, " step ",
                      d.pos, ")");
    }
  }
  if (first_rank >= 0) {
    return ScheduleCellError(schedule, first_rank, pos[first_rank],
                             absl::StrCat("the per-rank orders cannot all make progress (an input "
                                          "is needed before it can be produced):",
                                          waits));
  }
  return timing;
}

}  // namespace internal_schedule
}  // namespace pp
