#include "pipeline/schedule/analysis/validator.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "pipeline/schedule/ir/internal_execution.h"

namespace pp {
namespace {

// ValidateSchedule's steps: the sizes and the placement, each compute seen
// once, then the rules per (stage, micro-batch).

absl::Status CheckSizesAndPlacement(const Schedule& schedule) {
  const int p = schedule.num_stages;
  const int m = schedule.num_microbatches;
  if (p < 1 || m < 1 || schedule.num_chunks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule \"", schedule.name, "\": num_stages (", p, "), num_microbatches (",
                     m, ") and num_chunks (", schedule.num_chunks, ") must all be at least 1"));
  }
  const int num_virtual = schedule.num_virtual_stages();
  if (static_cast<int>(schedule.ranks.size()) != p ||
      static_cast<int>(schedule.stage_to_rank.size()) != num_virtual) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule \"", schedule.name, "\" has ", schedule.ranks.size(),
                     " rank lists and a placement of ", schedule.stage_to_rank.size(),
                     " stages; expected ", p, " and ", num_virtual));
  }
  for (int s = 0; s < num_virtual; ++s) {
    if (schedule.stage_to_rank[s] < 0 || schedule.stage_to_rank[s] >= p) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule \"", schedule.name, "\" places stage ", s, " on rank ",
                       schedule.stage_to_rank[s], ", outside [0, ", p, ")"));
    }
  }
  return absl::OkStatus();
}

struct Seen {
  int rank = -1;
  int pos = -1;
  int count = 0;
};

// (type, stage, mb) -> where it was seen and how often; dense over the
// compute types. REQUIRES: CheckSizesAndPlacement passed.
class SeenComputes {
 public:
  explicit SeenComputes(const Schedule& schedule)
      : num_virtual_(schedule.num_virtual_stages()),
        m_(schedule.num_microbatches),
        seen_(4 * num_virtual_ * m_) {}

  // Every cell in range and on its rank, no backward in a forward-only
  // schedule, every leaf at most once. Each action's ranges are checked
  // before it is recorded.
  absl::Status RecordAll(const Schedule& schedule) {
    for (int r = 0; r < static_cast<int>(schedule.ranks.size()); ++r) {
      for (int i = 0; i < static_cast<int>(schedule.ranks[r].size()); ++i) {
        PP_RETURN_IF_ERROR(CheckComputeCell(schedule, r, i));
        if (IsVocabCompute(schedule.ranks[r][i].type)) continue;  // CheckVocabularyPasses
        for (const Action& a : Leaves(schedule.ranks[r][i])) {
          if (schedule.forward_only && a.type != ActionType::kForward) {
            return ScheduleCellError(schedule, r, i,
                                     "a forward-only schedule has no backward actions");
          }
          Seen& entry = seen_[Key(a.type, a.stage, a.microbatch)];
          if (++entry.count > 1) {
            return ScheduleCellError(schedule, r, i,
                                     absl::StrCat(ActionToString(a),
                                                  " appears twice (first "
                                                  "at rank ",
                                                  entry.rank, " step ", entry.pos, ")"));
          }
          entry.rank = r;
          entry.pos = i;
        }
      }
    }
    return absl::OkStatus();
  }

  // Where (type, s, mb) runs; null when no rank runs it.
  const Seen* Find(ActionType type, int s, int mb) const {
    const Seen& entry = seen_[Key(type, s, mb)];
    return entry.count == 0 ? nullptr : &entry;
  }

 private:
  int Key(ActionType type, int s, int mb) const {
    return (static_cast<int>(type) * num_virtual_ + s) * m_ + mb;
  }

  int num_virtual_;
  int m_;
  std::vector<Seen> seen_;
};

// The rules for micro-batch `mb` on stage `s`: its forward, one kind of
// backward after it (W after I), and the order with the next stage when that
// stage is on the same rank.
absl::Status CheckStageMicrobatch(const Schedule& schedule, const SeenComputes& seen, int s,
                                  int mb) {
  const int num_virtual = schedule.num_virtual_stages();
  const int r = schedule.stage_to_rank[s];
  const int end = static_cast<int>(schedule.ranks[r].size());
  const Seen* f = seen.Find(ActionType::kForward, s, mb);
  const Seen* b = seen.Find(ActionType::kBackward, s, mb);
  const Seen* in = seen.Find(ActionType::kBackwardInput, s, mb);
  const Seen* w = seen.Find(ActionType::kBackwardWeight, s, mb);
  if (f == nullptr) {
    return ScheduleCellError(schedule, r, end, absl::StrCat("missing ", ActionToString(F(s, mb))));
  }
  if (schedule.forward_only) return absl::OkStatus();
  if (b != nullptr && (in != nullptr || w != nullptr)) {
    const Seen* split = in != nullptr ? in : w;
    return ScheduleCellError(schedule, r, split->pos,
                             absl::StrCat("(stage ", s, ", mb ", mb,
                                          ") has both a "
                                          "full backward B and a split I/W"));
  }
  if (b == nullptr && (in == nullptr || w == nullptr)) {
    return ScheduleCellError(
        schedule, r, end,
        absl::StrCat("missing backward of (stage ", s, ", mb ", mb, "): need ",
                     ActionToString(B(s, mb)), " or both ", ActionToString(I(s, mb)), " and ",
                     ActionToString(W(s, mb))));
  }
  const Seen* backward = b != nullptr ? b : in;
  if (backward->pos < f->pos) {
    return ScheduleCellError(schedule, r, backward->pos,
                             absl::StrCat("backward of (stage ", s, ", mb ", mb,
                                          ") runs before its forward (step ", f->pos, ")"));
  }
  if (w != nullptr && w->pos < in->pos) {
    return ScheduleCellError(schedule, r, w->pos,
                             absl::StrCat(ActionToString(W(s, mb)), " runs before ",
                                          ActionToString(I(s, mb)), " (step ", in->pos, ")"));
  }
  // Neighbouring stages on the same rank: order within the rank.
  if (s + 1 < num_virtual && schedule.stage_to_rank[s + 1] == r) {
    const Seen* next_f = seen.Find(ActionType::kForward, s + 1, mb);
    if (next_f != nullptr && next_f->pos < f->pos) {
      return ScheduleCellError(schedule, r, next_f->pos,
                               absl::StrCat("F on stage ", s + 1,
                                            " runs before F "
                                            "on stage ",
                                            s, " (step ", f->pos, ") for mb ", mb));
    }
    const Seen* next_b = seen.Find(ActionType::kBackward, s + 1, mb);
    if (next_b == nullptr) next_b = seen.Find(ActionType::kBackwardInput, s + 1, mb);
    if (next_b != nullptr && backward->pos < next_b->pos) {
      return ScheduleCellError(schedule, r, backward->pos,
                               absl::StrCat("backward on stage ", s,
                                            " runs before "
                                            "the backward on stage ",
                                            s + 1, " (step ", next_b->pos, ") for mb ", mb));
    }
  }
  return absl::OkStatus();
}

// The vocabulary's types a rank runs once per micro-batch: compute (a
// schedule's) or compute and collectives (a lowered program's).
std::vector<ActionType> VocabTypes(bool forward_only, bool with_collectives) {
  std::vector<ActionType> types = {ActionType::kVocabInputF, ActionType::kVocabOutputS};
  if (!forward_only) {
    types.insert(types.end(), {ActionType::kVocabOutputT, ActionType::kVocabInputB});
  }
  if (with_collectives) {
    types.insert(types.end(), {ActionType::kVocabInputReduce, ActionType::kVocabOutputBroadcast,
                               ActionType::kVocabOutputStats});
    if (!forward_only) {
      types.insert(types.end(), {ActionType::kVocabOutputReduce, ActionType::kVocabInputBroadcast});
    }
  }
  return types;
}

// One barrier: each rank's OUT_REDUCE<mb> rescales OUT_S<mb>'s partial with
// the statistics, and its OUT_T<mb> ends what OUT_S kept (the runtime's
// VocabularyLayers::OutputWeightGrad), so OUT_REDUCE comes first.
absl::Status CheckOneBarrierReduceBeforeOutputT(const LoweredProgram& program) {
  if (!program.vocab_parallel || program.vocab_barriers != 1 || program.forward_only) {
    return absl::OkStatus();
  }
  for (int r = 0; r < static_cast<int>(program.ranks.size()); ++r) {
    std::vector<bool> reduced(program.num_microbatches, false);
    for (const Action& a : program.ranks[r]) {
      if (a.microbatch < 0 || a.microbatch >= program.num_microbatches) continue;
      if (a.type == ActionType::kVocabOutputReduce) reduced[a.microbatch] = true;
      if (a.type == ActionType::kVocabOutputT && !reduced[a.microbatch]) {
        return absl::InvalidArgumentError(
            absl::StrCat("lowered program of \"", program.schedule_name, "\": rank ", r,
                         " runs OUT_T", a.microbatch, " before OUT_REDUCE", a.microbatch,
                         "; with one barrier OUT_REDUCE rescales OUT_S", a.microbatch,
                         "'s partial gradient, which OUT_T ends: put OUT_REDUCE first\n",
                         FormatGrid(program.ranks)));
      }
    }
  }
  return absl::OkStatus();
}

// Every rank runs each vocabulary action of `types` exactly once per
// micro-batch (none without vocabulary parallelism); `where` names the list.
absl::Status CheckVocabularyCounts(const RankActions& ranks, int m, bool vocab_parallel,
                                   const std::vector<ActionType>& types, absl::string_view where) {
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    std::vector<int> counts(kNumVocabTypes * m, 0);
    auto count = [&](ActionType type, int mb) -> int& {
      return counts[VocabTypeIndex(type) * m + mb];
    };
    for (const Action& a : ranks[r]) {
      if (IsVocab(a.type) && a.microbatch >= 0 && a.microbatch < m) ++count(a.type, a.microbatch);
    }
    for (ActionType type : types) {
      for (int mb = 0; mb < m; ++mb) {
        const int n = count(type, mb);
        const int want = vocab_parallel ? 1 : 0;
        if (n != want) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": rank ", r, " runs ", ActionToString(Vocab(type, mb)), " ", n,
              " times; with vocabulary parallelism every rank runs it once, without it none does\n",
              FormatGrid(ranks)));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSchedule(const Schedule& schedule) {
  PP_RETURN_IF_ERROR(CheckSizesAndPlacement(schedule));
  SeenComputes seen(schedule);
  PP_RETURN_IF_ERROR(seen.RecordAll(schedule));
  for (int s = 0; s < schedule.num_virtual_stages(); ++s) {
    for (int mb = 0; mb < schedule.num_microbatches; ++mb) {
      PP_RETURN_IF_ERROR(CheckStageMicrobatch(schedule, seen, s, mb));
    }
  }
  PP_RETURN_IF_ERROR(
      CheckVocabularyCounts(schedule.ranks, schedule.num_microbatches, schedule.vocab_parallel,
                            VocabTypes(schedule.forward_only, /*with_collectives=*/false),
                            absl::StrCat("schedule \"", schedule.name, "\"")));
  // Cross-rank progress (data dependencies), then the lowered program.
  PP_ASSIGN_OR_RETURN(LoweredProgram program, Lower(schedule));
  return ValidateLoweredProgram(program);
}

absl::Status ValidateLoweredProgram(const LoweredProgram& program) {
  internal_schedule::ExecutionCosts costs;
  costs.compute = [](const Action&) { return 1.0; };
  absl::StatusOr<internal_schedule::Execution> ex = internal_schedule::Execute(program, costs);
  if (!ex.ok()) return ex.status();
  // Execute checks order and deadlock; counts: each stage's compute must be
  // complete for the program to be a whole step.
  const int m = program.num_microbatches;
  // Compute counts per (type, stage, mb); Execute checked the ranges.
  const int num_virtual = program.num_virtual_stages();
  std::vector<int> counts(4 * num_virtual * m, 0);
  auto count = [&](ActionType type, int s, int mb) -> int& {
    return counts[(static_cast<int>(type) * num_virtual + s) * m + mb];
  };
  for (const auto& actions : program.ranks) {
    for (const Action& action : actions) {
      if (!IsCompute(action.type)) continue;
      for (const Action& a : Leaves(action)) ++count(a.type, a.stage, a.microbatch);
    }
  }
  PP_RETURN_IF_ERROR(
      CheckVocabularyCounts(program.ranks, m, program.vocab_parallel,
                            VocabTypes(program.forward_only, /*with_collectives=*/true),
                            absl::StrCat("lowered program of \"", program.schedule_name, "\"")));
  PP_RETURN_IF_ERROR(CheckOneBarrierReduceBeforeOutputT(program));
  for (int s = 0; s < num_virtual; ++s) {
    for (int mb = 0; mb < m; ++mb) {
      const int fwd = count(ActionType::kForward, s, mb);
      const int full = count(ActionType::kBackward, s, mb);
      const int in = count(ActionType::kBackwardInput, s, mb);
      const int wt = count(ActionType::kBackwardWeight, s, mb);
      const bool ok = fwd == 1 && (program.forward_only ? full + in + wt == 0
                                                        : (full == 1 && in + wt == 0) ||
                                                              (full == 0 && in == 1 && wt == 1));
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lowered program of \"", program.schedule_name, "\": (stage ", s, ", mb ", mb, ") has ",
            fwd, " F, ", full, " B, ", in, " I, ", wt, " W; expected one F and ",
            program.forward_only ? "no backward" : "one B or one I and one W", "\n",
            FormatGrid(program.ranks)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pp
