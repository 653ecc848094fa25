#include "pipeline/schedule/ir/vocab_passes.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/ir/internal_dependencies.h"

namespace pp {
namespace {

absl::Status CheckBase(const Schedule& base, int barriers) {
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
  return absl::OkStatus();
}

// Where AddVocabularyPasses puts the passes: per micro-batch, on `timing`,
// the start of stage 0's forward, the end of the last virtual stage's
// forward, the end of that stage's backward (B or I; -1 when forward_only)
// and the end of stage 0's backward (-1 when forward_only).
struct VocabAnchors {
  std::vector<int> first_forward_start, last_forward_end, last_backward_end, first_backward_end;
};

absl::StatusOr<VocabAnchors> Anchors(const Schedule& base,
                                     const internal_schedule::ComputeTiming& timing) {
  const int m = base.num_microbatches;
  const int last = base.num_virtual_stages() - 1;
  VocabAnchors anchors;
  // The anchors in the order of their kinds below; the backward ones are
  // absent from a forward-only schedule.
  enum Kind { kFirstForwardStart, kLastForwardEnd, kLastBackwardEnd, kFirstBackwardEnd };
  std::vector<int>* const lists[] = {&anchors.first_forward_start, &anchors.last_forward_end,
                                     &anchors.last_backward_end, &anchors.first_backward_end};
  for (std::vector<int>* v : lists) v->assign(m, -1);
  // How often each anchor was seen: each must be once per micro-batch.
  std::vector<std::vector<int>> seen(std::size(lists), std::vector<int>(m, 0));
  bool in_range = true;
  auto Set = [&](Kind kind, int mb, int time) {
    if (mb < 0 || mb >= m) {
      in_range = false;
      return;
    }
    (*lists[kind])[mb] = time;
    ++seen[kind][mb];
  };
  for (int r = 0; r < base.num_stages; ++r) {
    for (int i = 0; i < static_cast<int>(base.ranks[r].size()); ++i) {
      for (const Action& a : Leaves(base.ranks[r][i])) {
        const bool backward =
            a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput;
        const int start = timing.start[r][i], end = timing.end[r][i];
        if (a.type == ActionType::kForward && a.stage == 0) {
          Set(kFirstForwardStart, a.microbatch, start);
        }
        if (a.type == ActionType::kForward && a.stage == last) {
          Set(kLastForwardEnd, a.microbatch, end);
        }
        if (backward && a.stage == last) Set(kLastBackwardEnd, a.microbatch, end);
        if (backward && a.stage == 0) Set(kFirstBackwardEnd, a.microbatch, end);
      }
    }
  }
  const int kinds = base.forward_only ? 2 : 4;
  bool once = in_range;
  for (int kind = 0; kind < static_cast<int>(seen.size()); ++kind) {
    for (int mb = 0; mb < m; ++mb) once = once && seen[kind][mb] == (kind < kinds ? 1 : 0);
  }
  if (!once) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule \"", base.name, "\" does not run every micro-batch's first forward",
                     base.forward_only ? "" : ", last forward and first backward", " once"));
  }
  return anchors;
}

}  // namespace

absl::StatusOr<Schedule> PlaceVocabularyPasses(const Schedule& base, int barriers,
                                               std::vector<TimedVocabPass> passes,
                                               const std::vector<std::vector<double>>& starts) {
  if (absl::Status ok = CheckBase(base, barriers); !ok.ok()) return ok;
  bool shaped = starts.size() == base.ranks.size();
  for (size_t r = 0; shaped && r < starts.size(); ++r) {
    shaped = starts[r].size() == base.ranks[r].size() &&
             std::is_sorted(starts[r].begin(), starts[r].end());
  }
  if (!shaped) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocabulary passes for schedule \"", base.name,
        "\": the actions' start times are not one nondecreasing list per rank, one per action"));
  }
  const int m = base.num_microbatches;
  std::vector<ActionType> kinds = {ActionType::kVocabInputF, ActionType::kVocabOutputS};
  if (!base.forward_only) {
    kinds.push_back(ActionType::kVocabOutputT);
    kinds.push_back(ActionType::kVocabInputB);
  }
  // Each of the m micro-batches' passes of `kinds` exactly once.
  std::map<std::pair<ActionType, int>, int> count;
  for (const TimedVocabPass& pass : passes) {
    if (std::find(kinds.begin(), kinds.end(), pass.action.type) == kinds.end() ||
        pass.action.microbatch < 0 || pass.action.microbatch >= m) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocabulary passes for schedule \"", base.name,
                       "\": ", ActionToString(pass.action), " is not one of its ", m,
                       " micro-batches' IN_F, OUT_S", base.forward_only ? "" : ", OUT_T, IN_B"));
    }
    ++count[{pass.action.type, pass.action.microbatch}];
  }
  for (ActionType kind : kinds) {
    for (int mb = 0; mb < m; ++mb) {
      if (const int n = count[{kind, mb}]; n != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "vocabulary passes for schedule \"", base.name, "\": ", ActionToString(Vocab(kind, mb)),
            " is placed ", n, " times; each pass goes once"));
      }
    }
  }
  std::stable_sort(
      passes.begin(), passes.end(),
      [](const TimedVocabPass& a, const TimedVocabPass& b) { return a.time < b.time; });

  Schedule out = base;
  out.name = absl::StrCat(base.name, barriers == 1 ? "+vocab1" : "+vocab");
  out.vocab_parallel = true;
  out.vocab_barriers = barriers;
  for (int r = 0; r < base.num_stages; ++r) {
    std::vector<Action>& actions = out.ranks[r];
    actions.clear();
    size_t next = 0;
    for (int i = 0; i < static_cast<int>(base.ranks[r].size()); ++i) {
      while (next < passes.size() && passes[next].time <= starts[r][i]) {
        actions.push_back(passes[next++].action);
      }
      actions.push_back(base.ranks[r][i]);
    }
    for (; next < passes.size(); ++next) actions.push_back(passes[next].action);
  }
  return out;
}

absl::StatusOr<Schedule> AddVocabularyPasses(const Schedule& base, int barriers) {
  if (absl::Status ok = CheckBase(base, barriers); !ok.ok()) return ok;
  const internal_schedule::DependencyCosts unit;  // Lower()'s default costs
  absl::StatusOr<internal_schedule::ComputeTiming> timing =
      internal_schedule::TimeComputeOrder(base, unit);
  if (!timing.ok()) return timing.status();
  absl::StatusOr<VocabAnchors> anchors = Anchors(base, *timing);
  if (!anchors.ok()) return anchors.status();
  // Sorted by (time, order at one time: IN_F, OUT_S, OUT_T, IN_B; micro-batch).
  std::vector<std::pair<std::tuple<int, int, int>, TimedVocabPass>> keyed;
  auto Put = [&](int time, int order, ActionType kind, int mb) {
    keyed.push_back({{time, order, mb}, {static_cast<double>(time), Vocab(kind, mb)}});
  };
  for (int mb = 0; mb < base.num_microbatches; ++mb) {
    // One pass ahead, so that stage 0 does not wait for the lookup.
    Put(std::max(0, anchors->first_forward_start[mb] - unit.vocab), 0, ActionType::kVocabInputF,
        mb);
    Put(anchors->last_forward_end[mb], 1, ActionType::kVocabOutputS, mb);
    if (base.forward_only) continue;
    // One barrier: the last stage's backward needs no OUT_T, which goes where
    // that backward has ended, filling slack as a W does.
    Put(barriers == 2 ? anchors->last_forward_end[mb] : anchors->last_backward_end[mb], 2,
        ActionType::kVocabOutputT, mb);
    Put(anchors->first_backward_end[mb], 3, ActionType::kVocabInputB, mb);
  }
  std::sort(keyed.begin(), keyed.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<TimedVocabPass> sorted;
  for (const auto& [key, pass] : keyed) sorted.push_back(pass);
  std::vector<std::vector<double>> starts(base.num_stages);
  for (int r = 0; r < base.num_stages; ++r) {
    starts[r].assign(timing->start[r].begin(), timing->start[r].end());
  }
  return PlaceVocabularyPasses(base, barriers, std::move(sorted), starts);
}

}  // namespace pp
