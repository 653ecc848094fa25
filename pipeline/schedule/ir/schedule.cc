#include "pipeline/schedule/ir/schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pp {

std::vector<int> LoopedPlacement(int num_stages, int num_chunks) {
  std::vector<int> placement(num_stages * num_chunks);
  for (int s = 0; s < static_cast<int>(placement.size()); ++s) {
    placement[s] = s % num_stages;
  }
  return placement;
}

std::vector<int> VPlacement(int num_stages) {
  std::vector<int> placement(2 * num_stages);
  for (int s = 0; s < 2 * num_stages; ++s) {
    placement[s] = s < num_stages ? s : 2 * num_stages - 1 - s;
  }
  return placement;
}

absl::Status CheckCommonOptions(const ScheduleOptions& options) {
  if (options.num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages (", options.num_stages, ") must be at least 1"));
  }
  if (options.num_microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_microbatches (", options.num_microbatches, ") must be at least 1"));
  }
  if (options.num_chunks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_chunks (", options.num_chunks, ") must be at least 1"));
  }
  if (options.group_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group_size (", options.group_size, ") must be 0 (the schedule's default) or positive"));
  }
  return absl::OkStatus();
}

Schedule EmptyLoopedSchedule(absl::string_view name, const ScheduleOptions& options) {
  Schedule schedule;
  schedule.name = std::string(name);
  schedule.num_stages = options.num_stages;
  schedule.num_microbatches = options.num_microbatches;
  schedule.num_chunks = options.num_chunks;
  schedule.stage_to_rank = LoopedPlacement(options.num_stages, options.num_chunks);
  schedule.ranks.resize(options.num_stages);
  return schedule;
}

std::string FormatGrid(const RankActions& ranks, std::optional<GridMark> mark) {
  size_t steps = 0;
  for (const auto& actions : ranks) steps = std::max(steps, actions.size());
  if (mark.has_value() && mark->step >= 0) {
    steps = std::max(steps, static_cast<size_t>(mark->step) + 1);
  }
  // With a mark, only the rows around it: an error in a schedule of
  // thousands of steps stays readable, and a search that meets thousands of
  // such errors (Synthesize) does not spend its time naming every action.
  constexpr size_t kContext = 10;
  size_t first = 0, last = steps;
  if (mark.has_value() && mark->step >= 0) {
    const size_t step = static_cast<size_t>(mark->step);
    first = step > kContext ? step - kContext : 0;
    last = std::min(steps, step + kContext + 1);
  }
  size_t width = 6;  // "rank N" header
  for (const auto& actions : ranks) {
    for (size_t step = first; step < std::min(last, actions.size()); ++step) {
      width = std::max(width, ActionToString(actions[step]).size() + 2);
    }
  }
  std::string out = absl::StrFormat("%5s", "step");
  for (size_t r = 0; r < ranks.size(); ++r) {
    out += absl::StrFormat("  %-*s", width, absl::StrCat("rank ", r));
  }
  out += "\n";
  if (first > 0) out += absl::StrFormat("  ... steps 0-%d not shown\n", first - 1);
  for (size_t step = first; step < last; ++step) {
    std::string row = absl::StrFormat("%5d", step);
    bool marked_row = false;
    for (size_t r = 0; r < ranks.size(); ++r) {
      std::string cell;
      bool marked = mark.has_value() && mark->rank == static_cast<int>(r) &&
                    mark->step == static_cast<int>(step);
      if (step < ranks[r].size()) {
        cell = ActionToString(ranks[r][step]);
        cell = marked ? absl::StrCat("[", cell, "]") : absl::StrCat(" ", cell);
      } else if (marked) {
        cell = "[ ]";
      }
      marked_row |= marked;
      row += absl::StrFormat("  %-*s", width, cell);
    }
    // Trailing blanks make diffs noisy.
    while (!row.empty() && row.back() == ' ') row.pop_back();
    if (marked_row) row += "   <-- here";
    out += row + "\n";
  }
  if (last < steps) out += absl::StrFormat("  ... steps %d-%d not shown\n", last, steps - 1);
  return out;
}

absl::Status ScheduleCellError(const Schedule& schedule, int rank, int step,
                               absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(
      "schedule \"", schedule.name, "\" (p=", schedule.num_stages,
      ", m=", schedule.num_microbatches, ", v=", schedule.num_chunks, "): rank ", rank, " step ",
      step, ": ", message, "\n", FormatGrid(schedule.ranks, GridMark{rank, step})));
}

absl::Status CheckComputeCell(const Schedule& schedule, int rank, int step) {
  const Action& cell = schedule.ranks[rank][step];
  const int num_virtual = schedule.num_virtual_stages();
  const int m = schedule.num_microbatches;
  if (IsVocabCompute(cell.type)) {
    if (!schedule.vocab_parallel) {
      return ScheduleCellError(schedule, rank, step,
                               "a vocabulary pass in a schedule without vocabulary parallelism "
                               "(Schedule::vocab_parallel is false)");
    }
    if (schedule.forward_only &&
        (cell.type == ActionType::kVocabOutputT || cell.type == ActionType::kVocabInputB)) {
      return ScheduleCellError(schedule, rank, step,
                               "a backward vocabulary pass in a forward-only schedule");
    }
    if (cell.microbatch < 0 || cell.microbatch >= m) {
      return ScheduleCellError(
          schedule, rank, step,
          absl::StrCat("micro-batch ", cell.microbatch, " is outside [0, ", m, ")"));
    }
    return absl::OkStatus();
  }
  if (!IsCompute(cell.type)) {
    return ScheduleCellError(schedule, rank, step,
                             "only compute actions (F, B, I, W, OVERLAP_F_B and, with "
                             "vocabulary parallelism, OUT_S, OUT_T, IN_F, IN_B) belong in a "
                             "schedule; Lower() adds communication and the tail");
  }
  if (cell.type == ActionType::kOverlapFB) {
    absl::Status pair = CheckOverlapPair(ForwardHalf(cell), BackwardHalf(cell));
    if (!pair.ok()) return ScheduleCellError(schedule, rank, step, pair.message());
  }
  for (const Action& a : Leaves(cell)) {
    if (a.stage < 0 || a.stage >= num_virtual) {
      return ScheduleCellError(
          schedule, rank, step,
          absl::StrCat("stage ", a.stage, " is outside [0, ", num_virtual, ")"));
    }
    if (schedule.stage_to_rank[a.stage] != rank) {
      return ScheduleCellError(
          schedule, rank, step,
          absl::StrCat("stage ", a.stage, " is placed on rank ", schedule.stage_to_rank[a.stage]));
    }
    if (a.microbatch < 0 || a.microbatch >= m) {
      return ScheduleCellError(
          schedule, rank, step,
          absl::StrCat("micro-batch ", a.microbatch, " is outside [0, ", m, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pp
