// The 1F1B and V-shaped (zbv, vhalf) schedules with vocabulary parallelism: their passes
// placed by AddVocabularyPasses (vocab_passes.h), with the output layer's
// two-barrier algorithm ("_vocab") or its one-barrier one ("_vocab1").
//
// "_overlap": the paper's 1F1B (arXiv 2411.05288, section 5): every rank
// runs as many more warm-up forwards as the algorithm has barriers, so that
// the last stage runs the next forward while every rank's OUT_S (and with two
// barriers OUT_T) and the collectives of a micro-batch are under way, instead
// of waiting for them before its backward. It pays that many micro-batches'
// activations on every rank. Made for asynchronous collectives (the Trainer's
// vocabulary_async_collectives), which run beside that forward; blocking
// ones still wait for each rank to reach them.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/ir/vocab_passes.h"
#include "pipeline/schedule/schedules/registry.h"
#include "pipeline/schedule/schedules/vhalf.h"

namespace pp {
namespace {

// `schedule` (one forward and one backward per stage and micro-batch, each
// rank's backwards after their forwards) reordered as 1F1B with `extra` more
// warm-up forwards per rank than it has (at most all of them): the
// forwards and the backwards each keep their order.
absl::StatusOr<Schedule> WithMoreWarmup(Schedule schedule, int extra) {
  for (std::vector<Action>& actions : schedule.ranks) {
    std::vector<Action> forwards, backwards;
    for (const Action& a : actions) {
      if (a.type != ActionType::kForward && a.type != ActionType::kBackward) {
        return absl::InvalidArgumentError(absl::StrCat("schedule \"", schedule.name, "\" has ",
                                                       ActionToString(a),
                                                       "; more warm-up needs F and B only"));
      }
      (a.type == ActionType::kForward ? forwards : backwards).push_back(a);
    }
    // 1F1B's warm-up forwards and the first of its steady state's pairs.
    const auto first_backward = std::find_if(actions.begin(), actions.end(), [](const Action& a) {
      return a.type == ActionType::kBackward;
    });
    const int leading = std::min(static_cast<int>(first_backward - actions.begin()) + extra,
                                 static_cast<int>(forwards.size()));
    actions.assign(forwards.begin(), forwards.begin() + leading);
    size_t f = leading, b = 0;
    while (b < backwards.size()) {
      actions.push_back(backwards[b++]);
      if (f < forwards.size()) actions.push_back(forwards[f++]);
    }
  }
  return schedule;
}

absl::StatusOr<Schedule> WithVocabularyPasses(absl::string_view base_name, absl::string_view name,
                                              const ScheduleOptions& options, int barriers = 2,
                                              bool overlap = false) {
  absl::StatusOr<Schedule> base = MakeSchedule(base_name, options);
  if (!base.ok()) return base.status();
  if (overlap) {
    base = WithMoreWarmup(*std::move(base), barriers);
    if (!base.ok()) return base.status();
  }
  absl::StatusOr<Schedule> out = AddVocabularyPasses(*base, barriers);
  if (out.ok()) out->name = std::string(name);
  return out;
}

// The paper's V-Half with vocabulary parallelism (arXiv 2411.05288; its
// authors' V-Half code): V-Half's block with every I one period (6 slots)
// later per barrier and no squeeze, so that each rank computes other
// micro-batches while a micro-batch's passes and collectives are under way.
// The passes go at fixed points of the block's grid of unit slots, with
// c(i) = the end of the last stage's forward of micro-batch i (rank 0's chunk
// 1) plus one slot, and h = p / 2 + 1 (rank 0's forwards before its first
// chunk-1 forward):
//   OUT_S(i) at c(i); OUT_T(i) at c(i + 1), the last one 2F + 2I after c(m - 1);
//   IN_F(i) first of all for i < h, else at c(i - h);
//   IN_B(i) at c(i + h + 2), the last h + 2 after every other action;
// each after the actions that start in its slot, and at one time IN_F, OUT_T,
// OUT_S, IN_B. One departure: the authors time the passes on the block's
// timeline as it runs (each action as early as its inputs allow), which at
// few micro-batches (m = 1 at p = 1) puts OUT_S after the last stage's I;
// on the grid, whose I's come g + 1 slots after that forward, every pass has
// its input.
absl::StatusOr<Schedule> PaperVHalfWithVocabularyPasses(absl::string_view name,
                                                        const ScheduleOptions& options,
                                                        int barriers) {
  std::vector<std::vector<double>> slots;
  absl::StatusOr<Schedule> base =
      MakeVHalf(options, {.extra_gap = 6 * barriers, .squeeze = false}, &slots);
  if (!base.ok()) return base.status();
  const int p = options.num_stages, m = options.num_microbatches, h = p / 2 + 1;
  constexpr double kAfterStarts = 0.5;
  std::vector<double> c(m);
  double makespan = 0;
  for (int r = 0; r < p; ++r) {
    for (size_t k = 0; k < slots[r].size(); ++k) {
      const Action& a = base->ranks[r][k];
      if (a.type == ActionType::kForward && a.stage == 2 * p - 1) {
        c[a.microbatch] = slots[r][k] + 2 + kAfterStarts;
      }
      makespan = std::max(makespan, slots[r][k] + 1);
    }
  }
  std::vector<TimedVocabPass> passes;
  for (int i = 0; i < m; ++i) {
    passes.push_back({i < h ? i - m : c[i - h], Vocab(ActionType::kVocabInputF, i)});
  }
  for (int i = 0; i < m; ++i) {
    passes.push_back({i + 1 < m ? c[i + 1] : c[i] + 4, Vocab(ActionType::kVocabOutputT, i)});
  }
  for (int i = 0; i < m; ++i) passes.push_back({c[i], Vocab(ActionType::kVocabOutputS, i)});
  for (int i = 0; i < m; ++i) {
    passes.push_back({i + h + 2 < m ? c[i + h + 2] : makespan + i + kAfterStarts,
                      Vocab(ActionType::kVocabInputB, i)});
  }
  absl::StatusOr<Schedule> out = PlaceVocabularyPasses(*base, barriers, std::move(passes), slots);
  if (out.ok()) out->name = std::string(name);
  return out;
}

}  // namespace

PP_REGISTER_SCHEDULE("1f1b_vocab",
                     "1f1b with vocabulary parallelism: embedding and head split over all ranks",
                     [](const ScheduleOptions& options) {
                       return WithVocabularyPasses("1f1b", "1f1b_vocab", options);
                     });
PP_REGISTER_SCHEDULE("zbv_vocab",
                     "zbv with vocabulary parallelism: embedding and head split over all ranks",
                     [](const ScheduleOptions& options) {
                       return WithVocabularyPasses("zbv", "zbv_vocab", options);
                     });
PP_REGISTER_SCHEDULE("1f1b_vocab1",
                     "1f1b with vocabulary parallelism, one barrier before the last stage's "
                     "backward (OUT_T after it)",
                     [](const ScheduleOptions& options) {
                       return WithVocabularyPasses("1f1b", "1f1b_vocab1", options, 1);
                     });
PP_REGISTER_SCHEDULE("zbv_vocab1",
                     "zbv with vocabulary parallelism, one barrier before the last stage's "
                     "backward (OUT_T after it)",
                     [](const ScheduleOptions& options) {
                       return WithVocabularyPasses("zbv", "zbv_vocab1", options, 1);
                     });

PP_REGISTER_SCHEDULE("vhalf_vocab",
                     "vhalf with vocabulary parallelism: embedding and head split over all "
                     "ranks, p + 2 activations per rank",
                     [](const ScheduleOptions& options) {
                       return WithVocabularyPasses("vhalf", "vhalf_vocab", options);
                     });
PP_REGISTER_SCHEDULE("vhalf_vocab1",
                     "vhalf with vocabulary parallelism, one barrier before the last stage's "
                     "backward (OUT_T after it)",
                     [](const ScheduleOptions& options) {
                       return WithVocabularyPasses("vhalf", "vhalf_vocab1", options, 1);
                     });

PP_REGISTER_SCHEDULE("1f1b_vocab_overlap",
                     "1f1b_vocab with two more warm-up forwards per rank (the paper's 1F1B "
                     "Vocab-2), so that the collectives can run beside compute",
                     [](const ScheduleOptions& options) {
                       return WithVocabularyPasses("1f1b", "1f1b_vocab_overlap", options, 2, true);
                     });
PP_REGISTER_SCHEDULE("1f1b_vocab1_overlap",
                     "1f1b_vocab1 with one more warm-up forward per rank (the paper's 1F1B "
                     "Vocab-1), so that the collectives can run beside compute",
                     [](const ScheduleOptions& options) {
                       return WithVocabularyPasses("1f1b", "1f1b_vocab1_overlap", options, 1, true);
                     });

PP_REGISTER_SCHEDULE("vhalf_vocab_overlap",
                     "the paper's V-Half with vocabulary parallelism (two barriers): each "
                     "micro-batch's backward two periods later, the passes beside compute",
                     [](const ScheduleOptions& options) {
                       return PaperVHalfWithVocabularyPasses("vhalf_vocab_overlap", options, 2);
                     });
PP_REGISTER_SCHEDULE("vhalf_vocab1_overlap",
                     "the paper's V-Half with vocabulary parallelism (one barrier): each "
                     "micro-batch's backward one period later, the passes beside compute",
                     [](const ScheduleOptions& options) {
                       return PaperVHalfWithVocabularyPasses("vhalf_vocab1_overlap", options, 1);
                     });

}  // namespace pp
