// Drawing and exchanging schedules: a time-aligned ASCII grid and an SVG
// timeline of a simulation, and CSV dump/load in PyTorch pipelining's layout
// (one row per rank, one action per cell, an empty cell is an idle step).
// The positional step x rank grid is FormatGrid (schedule.h); Chrome-trace
// JSON is chrome_trace.h.
#ifndef PIPELINE_SCHEDULE_FORMATS_RENDER_H_
#define PIPELINE_SCHEDULE_FORMATS_RENDER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

// One row per distinct compute start time of `sim`, one column per rank: the
// action starting then, "|" while a longer action still runs, blank when the
// rank idles.
//
//    time  rank 0  rank 1
//       0  0F0
//       1  0F1     1F0
//       2  |       1B0
std::string FormatTimelineGrid(const SimulationResult& sim);

struct SvgOptions {
  std::string title;           // first line above the timeline
  int num_stages = 0;          // p, to label chunks (stage / p); 0 = from sim
  double width_pixels = 1100;  // drawing width of the time axis
};

// A standalone SVG document: one row per rank, compute boxes coloured by type
// (F, B, I, W) with the micro-batch number (and chunk, when v > 1) inside,
// messages as thin grey bars when they take time, idle time as the light
// background showing through, a time axis and a legend.
std::string RenderSvg(const SimulationResult& sim, const SvgOptions& options = {});

// PyTorch's CSV layout: row r lists rank r's actions, one per cell.
std::string DumpCsv(const RankActions& ranks);

// The same layout aligned in time, as PyTorch writes it: one column per row
// of FormatTimelineGrid (distinct compute start times of `sim`), the action
// starting then or an empty cell (idle, or a longer action still running).
std::string DumpTimelineCsv(const SimulationResult& sim);

// Inverse of DumpCsv and DumpTimelineCsv; empty cells (idle steps) are skipped. InvalidArgument
// names the row and column of a malformed cell.
absl::StatusOr<RankActions> LoadCsv(absl::string_view text);

// A Schedule from compute actions per rank (e.g. from LoadCsv): p = number of
// rows, v = (largest stage + 1) / p under the looped placement, m = largest
// micro-batch + 1, forward_only when there is no backward. InvalidArgument if
// the stages do not fill whole chunks. Validate the result before use.
absl::StatusOr<Schedule> ScheduleFromRankActions(absl::string_view name, const RankActions& ranks);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_FORMATS_RENDER_H_
