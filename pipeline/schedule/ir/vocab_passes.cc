#include "pipeline/schedule/ir/vocab_passes.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/ir/internal_dependencies.h"

namespace pp {
namespace {

// A pass to insert on every rank: before the first action of the rank that
// starts at or after `time` (base timeline). Ties keep (time, order).
struct Insertion {
  int time;
  int order;  // IN_F, then OUT_S, OUT_T, then IN_B at one time
  Action action;
  bool operator<(const Insertion& o) const {
    return std::tie(time, order, action.microbatch) <
           std::tie(o.time, o.order, o.action.microbatch);
  }
};

}  // namespace

absl::StatusOr<Schedule> AddVocabularyPasses(const Schedule& base, int barriers) {
  if (barriers != 1 && barriers != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocabulary passes with ", barriers, " barriers: the output layer's algorithm has 1 or 2"));
  }
  if (base.vocab_parallel) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule \"", base.name, "\" already has vocabulary passes"));
  }
  if (!base.given_program.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule \"", base.name,
        "\" is given as a lowered program (a CSV file with communication): its vocabulary "
        "passes and their collectives belong in the file"));
  }
  const internal_schedule::DependencyCosts unit;  // Lower()'s default costs
  absl::StatusOr<internal_schedule::ComputeTiming> timing =
      internal_schedule::TimeComputeOrder(base, unit);
  if (!timing.ok()) return timing.status();

  const int m = base.num_microbatches;
  const int last = base.num_virtual_stages() - 1;
  std::vector<Insertion> insertions;
  for (int r = 0; r < base.num_stages; ++r) {
    for (int i = 0; i < static_cast<int>(base.ranks[r].size()); ++i) {
      for (const Action& a : Leaves(base.ranks[r][i])) {
        const int mb = a.microbatch;
        const bool backward =
            a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput;
        if (a.type == ActionType::kForward && a.stage == 0) {
          // One pass ahead, so that stage 0 does not wait for the lookup.
          const int time = std::max(0, timing->start[r][i] - unit.vocab);
          insertions.push_back({time, 0, Vocab(ActionType::kVocabInputF, mb)});
        }
        if (a.type == ActionType::kForward && a.stage == last) {
          insertions.push_back({timing->end[r][i], 1, Vocab(ActionType::kVocabOutputS, mb)});
          if (!base.forward_only && barriers == 2) {
            insertions.push_back({timing->end[r][i], 2, Vocab(ActionType::kVocabOutputT, mb)});
          }
        }
        // One barrier: the last stage's backward needs no OUT_T, which goes
        // where that backward has ended, filling slack as a W does.
        if (backward && a.stage == last && barriers == 1) {
          insertions.push_back({timing->end[r][i], 2, Vocab(ActionType::kVocabOutputT, mb)});
        }
        if (backward && a.stage == 0) {
          insertions.push_back({timing->end[r][i], 3, Vocab(ActionType::kVocabInputB, mb)});
        }
      }
    }
  }
  if (static_cast<int>(insertions.size()) != (base.forward_only ? 2 : 4) * m) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule \"", base.name, "\" does not run every micro-batch's first forward",
                     base.forward_only ? "" : ", last forward and first backward", " once"));
  }
  std::sort(insertions.begin(), insertions.end());

  Schedule out = base;
  out.name = absl::StrCat(base.name, barriers == 1 ? "+vocab1" : "+vocab");
  out.vocab_parallel = true;
  out.vocab_barriers = barriers;
  for (int r = 0; r < base.num_stages; ++r) {
    std::vector<Action>& actions = out.ranks[r];
    actions.clear();
    size_t next = 0;
    for (int i = 0; i < static_cast<int>(base.ranks[r].size()); ++i) {
      while (next < insertions.size() && insertions[next].time <= timing->start[r][i]) {
        actions.push_back(insertions[next++].action);
      }
      actions.push_back(base.ranks[r][i]);
    }
    for (; next < insertions.size(); ++next) actions.push_back(insertions[next].action);
  }
  return out;
}

}  // namespace pp
