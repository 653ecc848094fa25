#include "pipeline/schedule/csv.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
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
#include "pipeline/schedule/validator.h"

namespace pp {
namespace {

constexpr absl::string_view kPlacementKey = "stage_to_rank";

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
};

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

// Column x rank grid of the file's cells (the file transposed, as FormatGrid
// shows schedules), with the cell at (rank, column) in brackets.
std::string FormatCells(const RawCsv& csv, int mark_rank, int mark_column) {
  size_t columns = 0, width = 6;
  for (const auto& row : csv.rows) {
    columns = std::max(columns, row.size());
    for (const Cell& c : row) width = std::max(width, c.text.size() + 2);
  }
  std::string out = absl::StrFormat("%7s", "column");
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    out += absl::StrFormat("  %-*s", width, absl::StrCat("rank ", r));
  }
  out += "\n";
  for (size_t col = 0; col < columns; ++col) {
    std::string line = absl::StrFormat("%7d", col + 1);
    bool marked_line = false;
    for (size_t r = 0; r < csv.rows.size(); ++r) {
      const bool marked =
          static_cast<int>(r) == mark_rank && static_cast<int>(col) + 1 == mark_column;
      std::string text = col < csv.rows[r].size() ? csv.rows[r][col].text : "";
      line += absl::StrFormat("  %-*s", width,
                              marked ? absl::StrCat("[", text, "]") : absl::StrCat(" ", text));
      marked_line |= marked;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    if (marked_line) line += "   <-- here";
    out += line + "\n";
  }
  return out;
}

absl::Status CellError(const CsvReadOptions& options, const RawCsv& csv, int rank, const Cell& cell,
                       absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(options.source, ": line ", cell.line, ", column ", cell.column, " (rank ", rank,
                   "): \"", cell.text, "\": ", message, "\n", FormatCells(csv, rank, cell.column)));
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
              options.source, ": line ", line_number, ": \"", line, "\": expected \"# ",
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

// PyTorch's FSDP actions, which pipe skips: "<stage>UNSHARD", "<stage>RESHARD".
bool IsFsdpAction(absl::string_view text) {
  size_t i = 0;
  while (i < text.size() && absl::ascii_isdigit(text[i])) ++i;
  if (i == 0) return false;
  absl::string_view rest = text.substr(i);
  return rest == "UNSHARD" || rest == "RESHARD";
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
                      ", column ", cell.column, ": \"", cell.text,
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
  std::string out = PlacementLine(schedule.stage_to_rank, schedule.num_stages);
  for (const auto& actions : schedule.ranks) {
    out += absl::StrJoin(actions, ",", [](std::string* o, const Action& a) {
      absl::StrAppend(o, ActionToString(a));
    });
    out += "\n";
  }
  return out;
}

std::string ProgramToCsv(const LoweredProgram& program) {
  std::string out = PlacementLine(program.stage_to_rank, program.num_stages);
  for (const auto& actions : program.ranks) {
    std::vector<std::string> cells;
    for (const Action& a : actions) {
      // PyTorch's reader needs a stage on every action: REDUCE_TIED and STEP
      // have none; the reader rebuilds them.
      if (a.type == ActionType::kReduceTiedGrads || a.type == ActionType::kOptimizerStep) {
        continue;
      }
      cells.push_back(ActionToString(a));
    }
    out += absl::StrJoin(cells, ",") + "\n";
  }
  return out;
}

absl::StatusOr<Schedule> ParseCsvSchedule(absl::string_view text, const CsvReadOptions& options) {
  absl::StatusOr<RawCsv> split = SplitCsv(text, options);
  if (!split.ok()) return split.status();
  const RawCsv& csv = *split;
  const int p = static_cast<int>(csv.rows.size());

  // Parse every cell; the actions a rank runs, with the cell each came from.
  struct Parsed {
    Action action;
    const Cell* cell;
  };
  std::vector<std::vector<Parsed>> parsed(p);
  bool comms = false;
  int max_stage = -1, max_mb = -1;
  for (int r = 0; r < p; ++r) {
    for (const Cell& cell : csv.rows[r]) {
      if (cell.text.empty()) continue;  // idle step
      if (IsFsdpAction(cell.text)) {
        comms = true;  // only PyTorch's compute + comms form has them
        continue;
      }
      absl::StatusOr<Action> action = ParseAction(cell.text);
      if (!action.ok()) {
        return CellError(options, csv, r, cell,
                         absl::StrCat(action.status().message(),
                                      "; an empty cell is an idle step, <s>UNSHARD/<s>RESHARD "
                                      "are skipped"));
      }
      comms |= !IsCompute(action->type);
      max_stage = std::max(max_stage, action->stage);
      if (HasMicrobatch(action->type)) max_mb = std::max(max_mb, action->microbatch);
      parsed[r].push_back({*action, &cell});
    }
  }
  if (max_mb < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.source,
                     ": no compute action in any cell; expected one row per rank with actions "
                     "such as 0F0, 0B0 (or 0I0 and 0W0)\n",
                     FormatCells(csv, -1, -1)));
  }

  // Every (stage, micro-batch) needs a forward cell: bounds the sizes below.
  int64_t num_compute = 0;
  for (const auto& actions : parsed) {
    for (const Parsed& x : actions) num_compute += IsCompute(x.action.type) ? 1 : 0;
  }
  if ((static_cast<int64_t>(max_stage) + 1) * (static_cast<int64_t>(max_mb) + 1) > num_compute) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.source, ": the cells name stages up to ", max_stage, " and micro-batches up to ",
        max_mb, ", which needs at least ", (static_cast<int64_t>(max_stage) + 1), " x ",
        (static_cast<int64_t>(max_mb) + 1), " forwards, but the file has only ", num_compute,
        " compute cells; stages and micro-batches count from 0 without gaps"));
  }

  // Placement: the option, the file's line, or looped.
  std::string placement_text = options.stage_to_rank;
  if (!csv.placement.empty() && !placement_text.empty() && csv.placement != placement_text) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.source, ": line ", csv.placement_line, " places stages by \"",
                     csv.placement, "\", but stage_to_rank \"", placement_text,
                     "\" was asked for; remove one or make them agree"));
  }
  if (placement_text.empty()) placement_text = csv.placement;
  if (placement_text.empty()) placement_text = "looped";
  absl::StatusOr<std::vector<int>> placement =
      ParseStageToRank(placement_text, p, std::max(max_stage + 1, p));
  if (!placement.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.source,
                     csv.placement_line != 0 && placement_text == csv.placement
                         ? absl::StrCat(" line ", csv.placement_line)
                         : "",
                     ": ", placement.status().message()));
  }
  const int num_virtual = static_cast<int>(placement->size());

  // Every cell's stage is on its rank (comm and tail actions too).
  for (int r = 0; r < p; ++r) {
    for (const Parsed& x : parsed[r]) {
      const int s = x.action.stage;
      if (!HasStage(x.action.type) || s < 0) continue;
      if ((*placement)[s] == r) continue;
      std::vector<int> local;
      for (int t = 0; t < num_virtual; ++t) {
        if ((*placement)[t] == r) local.push_back(t);
      }
      return CellError(
          options, csv, r, *x.cell,
          absl::StrCat("stage ", s, " is on rank ", (*placement)[s], " under the ", placement_text,
                       " placement; rank ", r, " holds stages ", absl::StrJoin(local, ", "),
                       " (set the placement with a \"# stage_to_rank: ...\" line)"));
    }
  }

  Schedule schedule;
  schedule.name = absl::StrCat(kCsvSchedulePrefix, options.source);
  schedule.num_stages = p;
  schedule.num_microbatches = max_mb + 1;
  schedule.num_chunks = num_virtual / p;
  schedule.stage_to_rank = *placement;
  schedule.ranks.resize(p);
  bool backward = false;
  std::vector<std::vector<const Cell*>> compute_cells(p), program_cells(p);
  for (int r = 0; r < p; ++r) {
    for (const Parsed& x : parsed[r]) {
      if (IsTail(x.action.type)) continue;  // rebuilt below
      program_cells[r].push_back(x.cell);
      if (!IsCompute(x.action.type)) continue;
      schedule.ranks[r].push_back(x.action);
      compute_cells[r].push_back(x.cell);
      backward |= x.action.type != ActionType::kForward;
    }
  }
  schedule.forward_only = !backward;

  auto located = [&](const absl::Status& status) {
    const std::string where =
        WhereInFile(status.message(), "schedule \"", compute_cells, options) +
        WhereInFile(status.message(), "lowered program of \"", program_cells, options);
    return absl::Status(status.code(), absl::StrCat(options.source, ": ", status.message(), where));
  };

  if (comms) {
    // The program as written, with the tail Lower() gives the compute order.
    absl::StatusOr<LoweredProgram> derived = Lower(schedule);
    if (!derived.ok()) return located(derived.status());
    schedule.given_program.resize(p);
    for (int r = 0; r < p; ++r) {
      for (const Parsed& x : parsed[r]) {
        if (!IsTail(x.action.type)) schedule.given_program[r].push_back(x.action);
      }
      for (const Action& a : derived->ranks[r]) {
        if (IsTail(a.type)) schedule.given_program[r].push_back(a);
      }
    }
  }
  absl::Status valid = ValidateSchedule(schedule);
  if (!valid.ok()) return located(valid);
  return schedule;
}

absl::StatusOr<Schedule> LoadCsvScheduleFile(const std::string& path, CsvReadOptions options) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("cannot read schedule CSV file \"", path,
                     "\" (a relative path is relative to the directory the command ran in)"));
  }
  std::stringstream text;
  text << file.rdbuf();
  if (file.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("error reading schedule CSV file \"", path, "\""));
  }
  options.source = path;
  return ParseCsvSchedule(text.str(), options);
}

}  // namespace pp
