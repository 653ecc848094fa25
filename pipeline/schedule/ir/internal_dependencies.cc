#include "pipeline/schedule/ir/internal_dependencies.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pp {
namespace internal_schedule {
namespace {

// TimeComputeOrder's steps: place every compute, find each one's producers,
// time the per-rank orders, and report the ranks that could not finish.

// Where each compute leaf (type, stage, mb) runs, and each rank's vocabulary
// passes (type, rank, mb); dense.
class ComputePlaces {
 public:
  explicit ComputePlaces(const Schedule& schedule)
      : num_virtual_(static_cast<int>(schedule.stage_to_rank.size())),
        m_(schedule.num_microbatches),
        p_(static_cast<int>(schedule.ranks.size())),
        where_(4 * num_virtual_ * m_, Dependency{-1, -1}),
        vocab_where_(schedule.vocab_parallel ? 4 * p_ * m_ : 0, Dependency{-1, -1}) {}

  // Every cell in range and on its rank, every leaf once.
  absl::Status PlaceAll(const Schedule& schedule) {
    for (int r = 0; r < static_cast<int>(schedule.ranks.size()); ++r) {
      for (int i = 0; i < static_cast<int>(schedule.ranks[r].size()); ++i) {
        PP_RETURN_IF_ERROR(CheckComputeCell(schedule, r, i));
        for (const Action& a : Leaves(schedule.ranks[r][i])) {
          Dependency& slot = IsVocabCompute(a.type)
                                 ? vocab_where_[VocabKey(a.type, r, a.microbatch)]
                                 : where_[Key(a)];
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
    return absl::OkStatus();
  }

  // Where `a` runs; rank -1 when no rank runs it. REQUIRES: `a` in range
  // (PlaceAll checked every cell).
  const Dependency& Of(const Action& a) const { return where_[Key(a)]; }
  // Where `rank` runs its vocabulary pass `type` of `mb`; rank -1 when it
  // does not. REQUIRES: a vocab_parallel schedule, arguments in range.
  const Dependency& OfVocab(ActionType type, int rank, int mb) const {
    return vocab_where_[VocabKey(type, rank, mb)];
  }

 private:
  int Key(const Action& a) const {
    return (static_cast<int>(a.type) * num_virtual_ + a.stage) * m_ + a.microbatch;
  }
  int VocabKey(ActionType type, int rank, int mb) const {
    return (VocabTypeIndex(type) * p_ + rank) * m_ + mb;
  }

  int num_virtual_;
  int m_;
  int p_;
  std::vector<Dependency> where_;
  std::vector<Dependency> vocab_where_;
};

// timing.deps[r][i]: the producers of each input of compute i of rank r.
absl::Status FindDependencies(const Schedule& schedule, const ComputePlaces& places,
                              ComputeTiming& timing) {
  const int num_virtual = static_cast<int>(schedule.stage_to_rank.size());
  const int p = static_cast<int>(schedule.ranks.size());
  for (int r = 0; r < static_cast<int>(schedule.ranks.size()); ++r) {
    const auto& actions = schedule.ranks[r];
    for (int i = 0; i < static_cast<int>(actions.size()); ++i) {
      for (const Action& a : Leaves(actions[i])) {
        auto need = [&](std::vector<Action> alternatives) -> absl::Status {
          for (const Action& alt : alternatives) {
            const Dependency& found = places.Of(alt);
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
        // A vocabulary pass of every rank: the collective between them
        // gathers all ranks' shares.
        auto need_on_every_rank = [&](ActionType type) -> absl::Status {
          for (int q = 0; q < p; ++q) {
            const Dependency& found = places.OfVocab(type, q, a.microbatch);
            if (found.rank < 0) {
              return ScheduleCellError(
                  schedule, r, i,
                  absl::StrCat(ActionToString(a), " needs ",
                               ActionToString(Vocab(type, a.microbatch)), " on every rank; rank ",
                               q, " does not run it"));
            }
            timing.deps[r][i].push_back(found);
          }
          return absl::OkStatus();
        };
        const bool vocab = schedule.vocab_parallel;
        absl::Status status;
        switch (a.type) {
          case ActionType::kForward:
            if (a.stage > 0) status = need({F(a.stage - 1, a.microbatch)});
            if (a.stage == 0 && vocab) status = need_on_every_rank(ActionType::kVocabInputF);
            break;
          case ActionType::kBackward:
          case ActionType::kBackwardInput:
            status = need({F(a.stage, a.microbatch)});
            if (status.ok() && a.stage + 1 < num_virtual) {
              status = need({B(a.stage + 1, a.microbatch), I(a.stage + 1, a.microbatch)});
            }
            if (status.ok() && a.stage + 1 == num_virtual && vocab) {
              // Its output gradient is OUT_REDUCE's sum, of OUT_T's shares
              // or, in the one-barrier form, of OUT_S's.
              status = need_on_every_rank(schedule.vocab_barriers == 1 ? ActionType::kVocabOutputS
                                                                       : ActionType::kVocabOutputT);
            }
            break;
          case ActionType::kVocabOutputS:
            status = need({F(num_virtual - 1, a.microbatch)});
            break;
          case ActionType::kVocabOutputT:
            status = need_on_every_rank(ActionType::kVocabOutputS);
            break;
          case ActionType::kVocabInputB:
            status = need({B(0, a.microbatch), I(0, a.microbatch)});
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
  return absl::OkStatus();
}

int CostOf(const Action& action, const DependencyCosts& costs) {
  int total = 0;
  for (const Action& a : Leaves(action)) {
    switch (a.type) {
      case ActionType::kForward:
        total += costs.forward;
        break;
      case ActionType::kBackward:
        total += costs.backward;
        break;
      case ActionType::kBackwardInput:
        total += costs.backward_input;
        break;
      case ActionType::kBackwardWeight:
        total += costs.backward_weight;
        break;
      default:  // a vocabulary pass
        total += costs.vocab;
    }
  }
  return total;
}

// List scheduling: each rank runs its order as soon as the inputs are there.
// Fills timing.start/end; returns each rank's first compute that never ran
// (its list's size when all ran).
std::vector<int> TimeInOrder(const Schedule& schedule, const DependencyCosts& costs,
                             ComputeTiming& timing) {
  const int p = static_cast<int>(schedule.ranks.size());
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
        timing.end[r][i] = ready + CostOf(schedule.ranks[r][i], costs);
        free_at[r] = timing.end[r][i];
        ++pos[r];
        progress = true;
      }
    }
  }
  return pos;
}

// Stuck ranks: report each one's wait; mark the first. OK when none is stuck.
absl::Status StuckRanksError(const Schedule& schedule, const ComputeTiming& timing,
                             const std::vector<int>& pos) {
  std::string waits;
  int first_rank = -1;
  for (int r = 0; r < static_cast<int>(pos.size()); ++r) {
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
  if (first_rank < 0) return absl::OkStatus();
  return ScheduleCellError(schedule, first_rank, pos[first_rank],
                           absl::StrCat("the per-rank orders cannot all make progress (an input "
                                        "is needed before it can be produced):",
                                        waits));
}

}  // namespace

absl::StatusOr<ComputeTiming> TimeComputeOrder(const Schedule& schedule,
                                               const DependencyCosts& costs) {
  const int p = schedule.num_stages;
  if (static_cast<int>(schedule.ranks.size()) != p) {
    return absl::InvalidArgumentError(absl::StrCat("schedule \"", schedule.name, "\" has ",
                                                   schedule.ranks.size(),
                                                   " rank lists for num_stages ", p));
  }
  ComputePlaces places(schedule);
  PP_RETURN_IF_ERROR(places.PlaceAll(schedule));

  ComputeTiming timing;
  timing.start.resize(p);
  timing.end.resize(p);
  timing.deps.resize(p);
  for (int r = 0; r < p; ++r) {
    const size_t n = schedule.ranks[r].size();
    timing.start[r].assign(n, -1);
    timing.end[r].assign(n, -1);
    timing.deps[r].resize(n);
  }
  PP_RETURN_IF_ERROR(FindDependencies(schedule, places, timing));
  const std::vector<int> pos = TimeInOrder(schedule, costs, timing);
  PP_RETURN_IF_ERROR(StuckRanksError(schedule, timing, pos));
  return timing;
}

}  // namespace internal_schedule
}  // namespace pp
