#include "pipeline/schedule/formats/csv.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "pipeline/schedule/analysis/validator.h"

namespace pp {
namespace {

constexpr absl::string_view kPlacementKey = "stage_to_rank";
// The output layer's algorithm under vocabulary parallelism
// (Schedule::vocab_barriers): "# vocab_barriers: 1"; without it, 2.
constexpr absl::string_view kVocabBarriersKey = "vocab_barriers";

// One cell of the file as written: where it is and what it says.
struct Cell {
  int line = 0;    // 1-based line of the file
  int column = 0;  // 1-based column (cell index) within the line
  std::string text;
};

// The data rows of a file: rows[r] is rank r's cells, empty ones included.
struct RawCsv {
  std::vector<std::vector<Cell>> rows;
  std::string placement;  // value of the `# stage_to_rank:` line, if any
  int placement_line = 0;
  int vocab_barriers = 2;  // the `# vocab_barriers:` line's, if any
  int vocab_barriers_line = 0;
};

// "# vocab_barriers: 1" for a one-barrier vocabulary schedule; nothing for
// the two-barrier default (files written before the marker mean that).
std::string VocabBarriersLine(bool vocab_parallel, int barriers) {
  if (!vocab_parallel || barriers == 2) return "";
  return absl::StrCat("# ", kVocabBarriersKey, ": ", barriers, "\n");
}

bool IsLooped(const std::vector<int>& placement, int p) {
  for (size_t s = 0; s < placement.size(); ++s) {
    if (placement[s] != static_cast<int>(s) % p) return false;
  }
  return true;
}

std::string PlacementLine(const std::vector<int>& placement, int p) {
  if (IsLooped(placement, p)) return "";
  if (placement == VPlacement(p)) return absl::StrCat("# ", kPlacementKey, ": v\n");
  return absl::StrCat("# ", kPlacementKey, ": ", absl::StrJoin(placement, ","), "\n");
}

// Longest cell text shown, and columns shown around the marked one: the
// grid and the message stay small whatever the file holds (a 100 KB cell or
// 100k empty cells made formatting quadratic, issue #29).
constexpr size_t kMaxCellText = 40;
constexpr int kGridColumnsAround = 8;

std::string Shown(absl::string_view text) {
  if (text.size() <= kMaxCellText) return std::string(text);
  return absl::StrCat(text.substr(0, kMaxCellText), "... (", text.size(), " characters)");
}

// Column x rank grid of the file's cells (the file transposed, as FormatGrid
// shows schedules), with the cell at (rank, column) in brackets; at most
// kGridColumnsAround columns either side of it (the first ones when nothing
// is marked) and kMaxCellText characters of a cell.
std::string FormatCells(const RawCsv& csv, int mark_rank, int mark_column) {
  size_t columns = 0;
  for (const auto& row : csv.rows) columns = std::max(columns, row.size());
  const int center = mark_column > 0 ? mark_column - 1 : 0;
  const size_t first = static_cast<size_t>(std::max(0, center - kGridColumnsAround));
  const size_t last = std::min(columns, static_cast<size_t>(center + kGridColumnsAround + 1));
  size_t width = 6;
  for (const auto& row : csv.rows) {
    for (size_t col = first; col < last && col < row.size(); ++col) {
      width = std::max(width, Shown(row[col].text).size() + 2);
    }
  }
  std::string out = absl::StrFormat("%7s", "column");
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    out += absl::StrFormat("  %-*s", width, absl::StrCat("rank ", r));
  }
  out += "\n";
  if (first > 0) out += absl::StrFormat("%7s  (columns 1..%d not shown)\n", "...", first);
  for (size_t col = first; col < last; ++col) {
    std::string line = absl::StrFormat("%7d", col + 1);
    bool marked_line = false;
    for (size_t r = 0; r < csv.rows.size(); ++r) {
      const bool marked =
          static_cast<int>(r) == mark_rank && static_cast<int>(col) + 1 == mark_column;
      std::string text = col < csv.rows[r].size() ? Shown(csv.rows[r][col].text) : "";
      line += absl::StrFormat("  %-*s", width,
                              marked ? absl::StrCat("[", text, "]") : absl::StrCat(" ", text));
      marked_line |= marked;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    if (marked_line) line += "   <-- here";
    out += line + "\n";
  }
  if (last < columns) {
    out += absl::StrFormat("%7s  (columns %d..%d not shown)\n", "...", last + 1, columns);
  }
  return out;
}

absl::Status CellError(const CsvReadOptions& options, const RawCsv& csv, int rank, const Cell& cell,
                       absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(
      options.source, ": line ", cell.line, ", column ", cell.column, " (rank ", rank, "): \"",
      Shown(cell.text), "\": ", message, "\n", FormatCells(csv, rank, cell.column)));
}

// Splits the text into comment lines and rows of cells.
absl::StatusOr<RawCsv> SplitCsv(absl::string_view text, const CsvReadOptions& options) {
  RawCsv csv;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  while (!lines.empty() && absl::StripAsciiWhitespace(lines.back()).empty()) lines.pop_back();
  for (size_t i = 0; i < lines.size(); ++i) {
    const int line_number = static_cast<int>(i) + 1;
    absl::string_view line = absl::StripSuffix(lines[i], "\r");
    absl::string_view stripped = absl::StripAsciiWhitespace(line);
    if (absl::ConsumePrefix(&stripped, "#")) {
      stripped = absl::StripAsciiWhitespace(stripped);
      if (absl::ConsumePrefix(&stripped, kPlacementKey)) {
        stripped = absl::StripLeadingAsciiWhitespace(stripped);
        if (!absl::ConsumePrefix(&stripped, ":") && !absl::ConsumePrefix(&stripped, "=")) {
          return absl::InvalidArgumentError(absl::StrCat(
              options.source, ": line ", line_number, ": \"", Shown(line), "\": expected \"# ",
              kPlacementKey, ": looped\", \"# ", kPlacementKey, ": v\" or \"# ", kPlacementKey,
              ": 0,1,1,0\" (a rank per virtual stage)"));
        }
        if (csv.placement_line != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              options.source, ": line ", line_number, ": a second \"# ", kPlacementKey,
              "\" line (the first is line ", csv.placement_line, "); give the placement once"));
        }
        csv.placement = std::string(absl::StripAsciiWhitespace(stripped));
        csv.placement_line = line_number;
      } else if (absl::ConsumePrefix(&stripped, kVocabBarriersKey)) {
        stripped = absl::StripLeadingAsciiWhitespace(stripped);
        int barriers = 0;
        if ((!absl::ConsumePrefix(&stripped, ":") && !absl::ConsumePrefix(&stripped, "=")) ||
            !absl::SimpleAtoi(absl::StripAsciiWhitespace(stripped), &barriers) ||
            (barriers != 1 && barriers != 2)) {
          return absl::InvalidArgumentError(
              absl::StrCat(options.source, ": line ", line_number, ": \"", Shown(line),
                           "\": expected \"# ", kVocabBarriersKey, ": 1\" or \"# ",
                           kVocabBarriersKey, ": 2\" (the vocabulary output layer's algorithm)"));
        }
        if (csv.vocab_barriers_line != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              options.source, ": line ", line_number, ": a second \"# ", kVocabBarriersKey,
              "\" line (the first is line ", csv.vocab_barriers_line, ")"));
        }
        csv.vocab_barriers = barriers;
        csv.vocab_barriers_line = line_number;
      }
      continue;  // any other comment
    }
    if (stripped.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.source, ": line ", line_number, " is empty, but it would be the row of rank ",
          csv.rows.size(),
          "; every rank needs a row of actions (remove the line, or start it with # to keep "
          "it as a comment)"));
    }
    std::vector<Cell> row;
    int column = 0;
    for (absl::string_view raw : absl::StrSplit(line, ',')) {
      ++column;
      absl::string_view cell = absl::StripAsciiWhitespace(raw);
      std::string value(cell);
      // Python's csv module quotes a field with special characters: "a""b".
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
        value = absl::StrReplaceAll(value.substr(1, value.size() - 2), {{"\"\"", "\""}});
        value = std::string(absl::StripAsciiWhitespace(value));
      }
      row.push_back({line_number, column, value});
    }
    csv.rows.push_back(std::move(row));
  }
  if (csv.rows.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.source,
                     ": no rows; expected one row per rank, one action per cell (e.g. "
                     "\"0F0,0F1,0B0,0B1\"), an empty cell for an idle step"));
  }
  return csv;
}

// PyTorch 2.15 actions pipe reads and does not run: `<s>UNSHARD`,
// `<s>RESHARD` (FSDP), `<s>WAIT_REDUCE_GRAD` (pipe's REDUCE_GRAD completes in
// place), `<s>WAIT_SEND_F<mb>`, `<s>WAIT_SEND_B<mb>` (pipe's runtime joins its
// sends itself). The regex is PyTorch's `_action_regex`.
struct PyTorchOnly {
  int stage = -1;
  std::string type;
  int microbatch = -1;  // WAIT_SEND_* only
  const Cell* cell = nullptr;
};

std::optional<PyTorchOnly> ParsePyTorchOnly(absl::string_view text) {
  size_t i = 0;
  while (i < text.size() && absl::ascii_isdigit(text[i])) ++i;
  if (i == 0 || i > 9) return std::nullopt;
  PyTorchOnly out;
  if (!absl::SimpleAtoi(text.substr(0, i), &out.stage)) return std::nullopt;
  absl::string_view rest = text.substr(i);
  for (absl::string_view type : {"UNSHARD", "RESHARD", "WAIT_REDUCE_GRAD"}) {
    if (rest == type) {
      out.type = std::string(type);
      return out;
    }
  }
  for (absl::string_view type : {"WAIT_SEND_F", "WAIT_SEND_B"}) {
    absl::string_view mb = rest;
    if (absl::ConsumePrefix(&mb, type) && !mb.empty() && mb.size() <= 9 &&
        std::all_of(mb.begin(), mb.end(), [](char c) { return absl::ascii_isdigit(c); }) &&
        absl::SimpleAtoi(mb, &out.microbatch)) {
      out.type = std::string(type);
      return out;
    }
  }
  return std::nullopt;
}

// A stage named by a cell of a rank's row.
struct StageCell {
  int rank;
  int stage;
  const Cell* cell;
};

// The placement the cells imply (PyTorch infers it the same way): stage s on
// the one rank whose row names it. "looped" or "v" when it is one of those,
// else the list. InvalidArgument names two cells that put a stage on two
// ranks, or a stage no cell names.
absl::StatusOr<std::string> InferPlacement(const RawCsv& csv, const std::vector<StageCell>& cells,
                                           int p, int max_stage, const CsvReadOptions& options) {
  const int num_virtual = std::max(max_stage + 1, p);
  std::vector<const StageCell*> owner(num_virtual, nullptr);
  for (const StageCell& c : cells) {
    const StageCell*& first = owner[c.stage];
    if (first == nullptr) {
      first = &c;
      continue;
    }
    if (first->rank == c.rank) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        options.source, ": cannot infer the placement: stage ", c.stage, " is named on rank ",
        first->rank, " (line ", first->cell->line, ", column ", first->cell->column, ": \"",
        Shown(first->cell->text), "\") and on rank ", c.rank, " (line ", c.cell->line, ", column ",
        c.cell->column, ": \"", Shown(c.cell->text),
        "\"); a stage runs on one rank. Fix the cells, or give the placement (\"# ", kPlacementKey,
        ": ...\" line or --stage_to_rank)\n", FormatCells(csv, c.rank, c.cell->column)));
  }
  std::vector<int> placement(num_virtual);
  for (int s = 0; s < num_virtual; ++s) {
    if (owner[s] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.source, ": cannot infer the placement: no cell names stage ", s,
          " (the cells name stages up to ", max_stage, " on ", p,
          " ranks); give the placement (\"# ", kPlacementKey, ": ...\" line or --stage_to_rank)"));
    }
    placement[s] = owner[s]->rank;
  }
  if (num_virtual % p == 0 && placement == LoopedPlacement(p, num_virtual / p)) return "looped";
  if (num_virtual == 2 * p && placement == VPlacement(p)) return "v";
  return absl::StrJoin(placement, ",");
}

// Maps "... rank R step S: ..." of a validator message to the CSV cell.
std::string WhereInFile(absl::string_view message, absl::string_view prefix,
                        const std::vector<std::vector<const Cell*>>& positions,
                        const CsvReadOptions& options) {
  if (!absl::StartsWith(message, prefix)) return "";
  const size_t at = message.find("): rank ");
  if (at == absl::string_view::npos) return "";
  int rank = -1, step = -1;
  if (std::sscanf(std::string(message.substr(at + 3, 40)).c_str(), "rank %d step %d", &rank,
                  &step) != 2) {
    return "";
  }
  if (rank < 0 || rank >= static_cast<int>(positions.size()) || step < 0 ||
      step >= static_cast<int>(positions[rank].size()) || positions[rank][step] == nullptr) {
    return "";
  }
  const Cell& cell = *positions[rank][step];
  return absl::StrCat("(rank ", rank, " step ", step, " is ", options.source, " line ", cell.line,
                      ", column ", cell.column, ": \"", Shown(cell.text),
                      "\"; steps count the rank's actions, empty cells skipped)\n");
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseStageToRank(absl::string_view text, int num_stages,
                                                  int num_virtual_stages) {
  const int p = num_stages;
  absl::string_view value = absl::StripAsciiWhitespace(text);
  if (value == "looped") {
    if (num_virtual_stages % p != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the looped placement needs whole chunks: the cells name stages 0..",
                       num_virtual_stages - 1, " (", num_virtual_stages,
                       " stages), not a multiple of ", p, " ranks"));
    }
    return LoopedPlacement(p, num_virtual_stages / p);
  }
  if (value == "v") {
    if (num_virtual_stages > 2 * p) {
      return absl::InvalidArgumentError(absl::StrCat("the V placement holds 2 x ", p, " = ", 2 * p,
                                                     " stages, but the cells name stage ",
                                                     num_virtual_stages - 1));
    }
    return VPlacement(p);
  }
  std::vector<int> placement;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    int rank = -1;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &rank) || rank < 0 || rank >= p) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage_to_rank \"", value, "\": entry \"", part, "\" is not a rank in [0, ", p,
          "); valid: looped, v, or a rank in [0, ", p, ") per virtual stage, e.g. 0,1,1,0"));
    }
    placement.push_back(rank);
  }
  const int n = static_cast<int>(placement.size());
  if (n % p != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage_to_rank \"", value, "\" places ", n, " stages on ", p,
        " ranks; every rank must hold the same number of stages (a multiple of ", p, ")"));
  }
  std::vector<int> per_rank(p, 0);
  for (int r : placement) ++per_rank[r];
  for (int r = 0; r < p; ++r) {
    if (per_rank[r] != n / p) {
      return absl::InvalidArgumentError(absl::StrCat("stage_to_rank \"", value, "\" puts ",
                                                     per_rank[r], " stages on rank ", r,
                                                     "; every rank must hold ", n / p));
    }
  }
  if (n < num_virtual_stages) {
    return absl::InvalidArgumentError(absl::StrCat("stage_to_rank \"", value, "\" places ", n,
                                                   " stages, but the cells name stage ",
                                                   num_virtual_stages - 1));
  }
  return placement;
}

std::string ScheduleToCsv(const Schedule& schedule) {
  std::string out = PlacementLine(schedule.stage_to_rank, schedule.num_stages) +
                    VocabBarriersLine(schedule.vocab_parallel, schedule.vocab_barriers);
  for (const auto& actions : schedule.ranks) {
    out += absl::StrJoin(actions, ",", [](std::string* o, const Action& a) {
      absl::StrAppend(o, ActionToString(a));
    });
    out += "\n";
  }
  return out;
}

std::string ProgramToCsv(const LoweredProgram& program) {
  std::string out = PlacementLine(program.stage_to_rank, program.num_stages) +
                    VocabBarriersLine(program.vocab_parallel, program.vocab_barriers);
  for (const auto& actions : program.ranks) {
    // PyTorch 2.15's form (_add_wait_send, _add_reduce_grad): a forward send
    // is waited for after the local backward of its micro-batch (the peer
    // has consumed it then); other sends at the end, before the tail; each
    // REDUCE_GRAD followed by its WAIT_REDUCE_GRAD.
    std::vector<std::string> cells;
    std::vector<std::tuple<ActionType, int, int>> pending;  // sends in program order
    auto wait = [](ActionType type, int stage, int mb) {
      return absl::StrCat(stage, type == ActionType::kSendForward ? "WAIT_SEND_F" : "WAIT_SEND_B",
                          mb);
    };
    std::vector<std::string> tail;
    for (const Action& a : actions) {
      // PyTorch's reader needs a stage on every action: REDUCE_TIED and STEP
      // have none; the reader rebuilds them.
      if (a.type == ActionType::kReduceTiedGrads || a.type == ActionType::kOptimizerStep) {
        continue;
      }
      if (a.type == ActionType::kReduceGrads) {
        tail.push_back(ActionToString(a));
        tail.push_back(absl::StrCat(a.stage, "WAIT_REDUCE_GRAD"));
        continue;
      }
      cells.push_back(ActionToString(a));
      if (a.type == ActionType::kSendForward || a.type == ActionType::kSendBackward) {
        pending.emplace_back(a.type, a.stage, a.microbatch);
      }
      for (const Action& leaf : Leaves(a)) {
        if (leaf.type != ActionType::kBackward && leaf.type != ActionType::kBackwardInput) continue;
        auto it = std::find(pending.begin(), pending.end(),
                            std::make_tuple(ActionType::kSendForward, leaf.stage, leaf.microbatch));
        if (it == pending.end()) continue;
        cells.push_back(wait(ActionType::kSendForward, leaf.stage, leaf.microbatch));
        pending.erase(it);
      }
    }
    for (const auto& [type, stage, mb] : pending) cells.push_back(wait(type, stage, mb));
    cells.insert(cells.end(), tail.begin(), tail.end());
    out += absl::StrJoin(cells, ",") + "\n";
  }
  return out;
}

namespace {

// ParseCsvSchedule's steps, in order: parse the cells, check the file's shape,
// choose the placement, check every cell against it, build the schedule.

// An action a rank runs, with the cell it came from.
struct ParsedCell {
  Action action;
  const Cell* cell;
};

// Every cell of the file, parsed (empty cells, idle steps, dropped).
struct ParsedCells {
  std::vector<std::vector<ParsedCell>> actions;        // per rank
  std::vector<std::vector<PyTorchOnly>> pytorch_only;  // per rank
  bool comms = false;                                  // the file is PyTorch's compute + comms form
  int max_stage = -1, max_mb = -1;
};

absl::StatusOr<ParsedCells> ParseCells(const RawCsv& csv, const CsvReadOptions& options) {
  const int p = static_cast<int>(csv.rows.size());
  ParsedCells out;
  out.actions.resize(p);
  out.pytorch_only.resize(p);
  for (int r = 0; r < p; ++r) {
    for (const Cell& cell : csv.rows[r]) {
      if (cell.text.empty()) continue;  // idle step
      if (std::optional<PyTorchOnly> only = ParsePyTorchOnly(cell.text)) {
        out.comms = true;  // only PyTorch's compute + comms form has them
        only->cell = &cell;
        out.pytorch_only[r].push_back(*only);
        continue;
      }
      if (cell.text.size() > kMaxCellText) {
        return CellError(options, csv, r, cell,
                         "too long for an action (e.g. 0F3, 1SEND_B2, (0F3;3B1)OVERLAP_F_B)");
      }
      absl::StatusOr<Action> action = ParseAction(cell.text);
      if (!action.ok()) {
        return CellError(options, csv, r, cell,
                         absl::StrCat(action.status().message(),
                                      "; an empty cell is an idle step; PyTorch's <s>UNSHARD, "
                                      "<s>RESHARD, <s>WAIT_REDUCE_GRAD, <s>WAIT_SEND_F<mb> and "
                                      "<s>WAIT_SEND_B<mb> are read and not run"));
      }
      out.comms |= !IsCompute(action->type) && !IsVocabCompute(action->type);
      out.max_stage = std::max(out.max_stage, action->stage);
      if (HasMicrobatch(action->type)) out.max_mb = std::max(out.max_mb, action->microbatch);
      out.actions[r].push_back({*action, &cell});
    }
  }
  return out;
}

// A compute action at all, and every (stage, micro-batch) can have a forward
// cell: bounds the sizes built later.
absl::Status CheckShape(const RawCsv& csv, const ParsedCells& cells,
                        const CsvReadOptions& options) {
  if (cells.max_mb < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.source,
                     ": no compute action in any cell; expected one row per rank with actions "
                     "such as 0F0, 0B0 (or 0I0 and 0W0)\n",
                     FormatCells(csv, -1, -1)));
  }
  int64_t num_compute = 0;
  for (const auto& actions : cells.actions) {
    for (const ParsedCell& x : actions) num_compute += IsCompute(x.action.type) ? 1 : 0;
  }
  const int64_t stages = static_cast<int64_t>(cells.max_stage) + 1;
  const int64_t microbatches = static_cast<int64_t>(cells.max_mb) + 1;
  if (stages * microbatches > num_compute) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.source, ": the cells name stages up to ", cells.max_stage,
                     " and micro-batches up to ", cells.max_mb, ", which needs at least ", stages,
                     " x ", microbatches, " forwards, but the file has only ", num_compute,
                     " compute cells; stages and micro-batches count from 0 without gaps"));
  }
  return absl::OkStatus();
}

struct CsvPlacement {
  std::string text;  // as given or inferred: "looped", "v", "0,1,1,0"
  std::vector<int> stage_to_rank;
};

// The option, the file's line, or (as PyTorch does) each stage on the rank
// whose row names it.
absl::StatusOr<CsvPlacement> ChoosePlacement(const RawCsv& csv, const ParsedCells& cells,
                                             const CsvReadOptions& options) {
  const int p = static_cast<int>(csv.rows.size());
  CsvPlacement placement;
  placement.text = options.stage_to_rank;
  if (!csv.placement.empty() && !placement.text.empty() && csv.placement != placement.text) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.source, ": line ", csv.placement_line, " places stages by \"",
                     csv.placement, "\", but stage_to_rank \"", placement.text,
                     "\" was asked for; remove one or make them agree"));
  }
  if (placement.text.empty()) placement.text = csv.placement;
  if (placement.text.empty()) {
    std::vector<StageCell> stage_cells;
    for (int r = 0; r < p; ++r) {
      for (const ParsedCell& x : cells.actions[r]) {
        for (const Action& a : Leaves(x.action)) {
          if (HasStage(a.type) && a.stage >= 0) stage_cells.push_back({r, a.stage, x.cell});
        }
      }
    }
    PP_ASSIGN_OR_RETURN(placement.text,
                        InferPlacement(csv, stage_cells, p, cells.max_stage, options));
  }
  absl::StatusOr<std::vector<int>> stage_to_rank =
      ParseStageToRank(placement.text, p, std::max(cells.max_stage + 1, p));
  if (!stage_to_rank.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.source,
                     csv.placement_line != 0 && placement.text == csv.placement
                         ? absl::StrCat(" line ", csv.placement_line)
                         : "",
                     ": ", stage_to_rank.status().message()));
  }
  placement.stage_to_rank = *std::move(stage_to_rank);
  return placement;
}

// Every cell's stage is on its rank (comm and tail actions too).
absl::Status CheckStagesOnTheirRanks(const RawCsv& csv, const ParsedCells& cells,
                                     const CsvPlacement& placement, const CsvReadOptions& options) {
  const std::vector<int>& stage_to_rank = placement.stage_to_rank;
  const int num_virtual = static_cast<int>(stage_to_rank.size());
  for (int r = 0; r < static_cast<int>(cells.actions.size()); ++r) {
    for (const ParsedCell& x : cells.actions[r]) {
      const int s = x.action.stage;
      if (!HasStage(x.action.type) || s < 0) continue;
      if (stage_to_rank[s] == r) continue;
      std::vector<int> local;
      for (int t = 0; t < num_virtual; ++t) {
        if (stage_to_rank[t] == r) local.push_back(t);
      }
      return CellError(
          options, csv, r, *x.cell,
          absl::StrCat("stage ", s, " is on rank ", stage_to_rank[s], " under the ", placement.text,
                       " placement; rank ", r, " holds stages ", absl::StrJoin(local, ", "),
                       " (set the placement with a \"# stage_to_rank: ...\" line)"));
    }
  }
  return absl::OkStatus();
}

// PyTorch-only cells: their stage on their rank, a wait after what it
// waits for (PyTorch's _validate_send_waits and REDUCE_GRAD pairing).
absl::Status CheckPyTorchOnlyCells(const RawCsv& csv, const ParsedCells& cells,
                                   const CsvPlacement& placement, const CsvReadOptions& options) {
  const std::vector<int>& stage_to_rank = placement.stage_to_rank;
  const int num_virtual = static_cast<int>(stage_to_rank.size());
  for (int r = 0; r < static_cast<int>(cells.pytorch_only.size()); ++r) {
    for (const PyTorchOnly& only : cells.pytorch_only[r]) {
      if (only.stage >= num_virtual || stage_to_rank[only.stage] != r) {
        return CellError(options, csv, r, *only.cell,
                         absl::StrCat("stage ", only.stage, " is not on rank ", r, " under the ",
                                      placement.text, " placement"));
      }
      if (only.type == "UNSHARD" || only.type == "RESHARD") continue;
      bool found = false;
      for (const ParsedCell& x : cells.actions[r]) {
        if (x.cell->column >= only.cell->column || x.cell->line != only.cell->line) continue;
        const Action& a = x.action;
        if (only.type == "WAIT_REDUCE_GRAD") {
          found |= a.type == ActionType::kReduceGrads && a.stage == only.stage;
        } else {
          const ActionType send =
              only.type == "WAIT_SEND_F" ? ActionType::kSendForward : ActionType::kSendBackward;
          found |= a.type == send && a.stage == only.stage && a.microbatch == only.microbatch;
        }
      }
      if (!found) {
        return CellError(options, csv, r, *only.cell,
                         only.type == "WAIT_REDUCE_GRAD"
                             ? absl::StrCat("no ", only.stage, "REDUCE_GRAD before it on this row")
                             : absl::StrCat("no ", only.stage, only.type.substr(5), only.microbatch,
                                            " before it on this row (a wait follows its send)"));
      }
    }
  }
  return absl::OkStatus();
}

// The schedule (each rank's compute cells) and, per rank, the cells its
// actions and its program's came from, so that an error can name its cell.
struct BuiltSchedule {
  Schedule schedule;
  std::vector<std::vector<const Cell*>> compute_cells, program_cells;
};

BuiltSchedule BuildSchedule(const ParsedCells& cells, const CsvPlacement& placement,
                            const CsvReadOptions& options) {
  const int p = static_cast<int>(cells.actions.size());
  BuiltSchedule out;
  Schedule& schedule = out.schedule;
  schedule.name = absl::StrCat(kCsvSchedulePrefix, options.source);
  schedule.num_stages = p;
  schedule.num_microbatches = cells.max_mb + 1;
  schedule.num_chunks = static_cast<int>(placement.stage_to_rank.size()) / p;
  schedule.stage_to_rank = placement.stage_to_rank;
  schedule.ranks.resize(p);
  out.compute_cells.resize(p);
  out.program_cells.resize(p);
  bool backward = false;
  for (int r = 0; r < p; ++r) {
    for (const ParsedCell& x : cells.actions[r]) {
      if (IsTail(x.action.type)) continue;  // rebuilt below
      out.program_cells[r].push_back(x.cell);
      schedule.vocab_parallel |= IsVocab(x.action.type);
      if (!IsCompute(x.action.type) && !IsVocabCompute(x.action.type)) continue;
      schedule.ranks[r].push_back(x.action);
      out.compute_cells[r].push_back(x.cell);
      backward |= x.action.type != ActionType::kForward &&
                  x.action.type != ActionType::kVocabInputF &&
                  x.action.type != ActionType::kVocabOutputS;
    }
  }
  schedule.forward_only = !backward;
  return out;
}

// The program as written, with the tail Lower() gives the compute order.
absl::Status AddGivenProgram(const ParsedCells& cells, Schedule& schedule) {
  PP_ASSIGN_OR_RETURN(LoweredProgram derived, Lower(schedule));
  const int p = static_cast<int>(cells.actions.size());
  schedule.given_program.resize(p);
  for (int r = 0; r < p; ++r) {
    for (const ParsedCell& x : cells.actions[r]) {
      if (!IsTail(x.action.type)) schedule.given_program[r].push_back(x.action);
    }
    for (const Action& a : derived.ranks[r]) {
      if (IsTail(a.type)) schedule.given_program[r].push_back(a);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Schedule> ParseCsvSchedule(absl::string_view text, const CsvReadOptions& options) {
  PP_ASSIGN_OR_RETURN(const RawCsv csv, SplitCsv(text, options));
  PP_ASSIGN_OR_RETURN(const ParsedCells cells, ParseCells(csv, options));
  PP_RETURN_IF_ERROR(CheckShape(csv, cells, options));
  PP_ASSIGN_OR_RETURN(const CsvPlacement placement, ChoosePlacement(csv, cells, options));
  PP_RETURN_IF_ERROR(CheckStagesOnTheirRanks(csv, cells, placement, options));
  PP_RETURN_IF_ERROR(CheckPyTorchOnlyCells(csv, cells, placement, options));
  BuiltSchedule built = BuildSchedule(cells, placement, options);
  if (csv.vocab_barriers_line != 0 && !built.schedule.vocab_parallel) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.source, ": line ", csv.vocab_barriers_line, ": \"# ", kVocabBarriersKey,
        "\" in a file without vocabulary actions (OUT_S<mb>, ...)"));
  }
  built.schedule.vocab_barriers = csv.vocab_barriers;

  // Lowering and validation errors, with the CSV cell they point at.
  auto located = [&](const absl::Status& status) {
    const std::string where =
        WhereInFile(status.message(), "schedule \"", built.compute_cells, options) +
        WhereInFile(status.message(), "lowered program of \"", built.program_cells, options);
    return absl::Status(status.code(), absl::StrCat(options.source, ": ", status.message(), where));
  };
  if (cells.comms) {
    absl::Status given = AddGivenProgram(cells, built.schedule);
    if (!given.ok()) return located(given);
  }
  absl::Status valid = ValidateSchedule(built.schedule);
  if (!valid.ok()) return located(valid);
  return std::move(built.schedule);
}

absl::StatusOr<Schedule> LoadCsvScheduleFile(const std::string& path, CsvReadOptions options) {
  // Only a regular file: opening a FIFO blocks until a writer comes, and a
  // device (/dev/zero) never ends (issue #29).
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (!error && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    const char* kind =
        std::filesystem::is_fifo(status)        ? "a FIFO"
        : std::filesystem::is_directory(status) ? "a directory"
        : std::filesystem::is_character_file(status) || std::filesystem::is_block_file(status)
            ? "a device"
            : "not a regular file";
    return absl::InvalidArgumentError(
        absl::StrCat("schedule CSV file \"", path, "\" is ", kind,
                     "; give a regular file (it is read whole before any worker starts)"));
  }
  if (!error && std::filesystem::exists(status)) {
    const std::uintmax_t size = std::filesystem::file_size(path, error);
    if (!error && size > kMaxCsvFileBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule CSV file \"", path, "\" has ", size, " bytes; the limit is ", kMaxCsvFileBytes,
          " (", kMaxCsvFileBytes >> 20,
          " MiB, far above any schedule: p = 64, m = 1024, v = 4 with comms is ~13 MB)"));
    }
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("cannot read schedule CSV file \"", path,
                     "\" (a relative path is relative to the directory the command ran in)"));
  }
  // Read at most the limit + 1 bytes: a file that grows while read is
  // refused like a large one.
  std::string text;
  char buffer[1 << 16];
  while (text.size() <= kMaxCsvFileBytes && file) {
    file.read(buffer, sizeof(buffer));
    text.append(buffer, static_cast<size_t>(file.gcount()));
  }
  if (file.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("error reading schedule CSV file \"", path, "\""));
  }
  if (text.size() > kMaxCsvFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule CSV file \"", path, "\" has more than ", kMaxCsvFileBytes, " bytes (the limit)"));
  }
  options.source = path;
  return ParseCsvSchedule(text, options);
}

}  // namespace pp
