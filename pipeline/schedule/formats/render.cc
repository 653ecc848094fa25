#include "pipeline/schedule/formats/render.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/xml_escape.h"

namespace pp {
namespace {

struct TypeStyle {
  ActionType type;
  const char* fill;
  const char* label;
};

constexpr TypeStyle kStyles[] = {
    {ActionType::kForward, "#4e79a7", "F forward"},
    {ActionType::kBackward, "#f28e2b", "B backward"},
    {ActionType::kBackwardInput, "#e15759", "I input grad"},
    {ActionType::kBackwardWeight, "#59a14f", "W weight grad"},
    {ActionType::kVocabInputF, "#76b7b2", "IN_F embedding shard"},
    {ActionType::kVocabOutputS, "#b07aa1", "OUT_S logits shard"},
    {ActionType::kVocabOutputT, "#ff9da7", "OUT_T softmax, grads"},
    {ActionType::kVocabInputB, "#edc948", "IN_B embedding grad"},
};

const char* Fill(ActionType type) {
  for (const TypeStyle& s : kStyles) {
    if (s.type == type) return s.fill;
  }
  return "#9d9d9d";
}

// A "nice" tick step for an axis of length `span` with about 10 ticks.
double TickStep(double span) {
  if (span <= 0) return 1;
  const double raw = span / 10;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * magnitude) return m * magnitude;
  }
  return 10 * magnitude;
}

// RenderSvg's steps. Each appends one part of the document to `svg`, in the
// order they are drawn (later parts paint over earlier ones).

// Where the parts of the drawing go.
struct SvgLayout {
  int ranks = 0;
  double makespan = 1;  // the time axis' length: sim.makespan, or 1 when it is 0
  double left = 70, top = 50, row_height = 30, row_gap = 8;
  double scale = 1;  // pixels per time unit
  double plot_height = 0;
  double width = 0, height = 0;  // the whole document
  double axis_y = 0;             // the time axis' line

  double RowY(int rank) const { return top + rank * (row_height + row_gap); }
};

SvgLayout MakeSvgLayout(const SimulationResult& sim, const SvgOptions& options) {
  SvgLayout l;
  l.ranks = static_cast<int>(sim.busy.size());
  l.makespan = sim.makespan > 0 ? sim.makespan : 1;
  l.scale = options.width_pixels / l.makespan;
  l.plot_height = l.ranks * (l.row_height + l.row_gap);
  l.width = l.left + options.width_pixels + 30;
  l.height = l.top + l.plot_height + 90;
  l.axis_y = l.top + l.plot_height + 4;
  return l;
}

// What the timeline holds, which decides the labels and the legend.
struct TimelineContents {
  std::set<ActionType> used;        // compute types drawn (the vocabulary's too)
  bool chunks = false;              // a stage >= num_stages: label micro-batch.chunk
  bool messages_take_time = false;  // a message with a duration: drawn as a grey bar
};

TimelineContents ScanTimeline(const SimulationResult& sim, int num_stages) {
  TimelineContents c;
  for (const TraceEvent& e : sim.timeline) {
    absl::StatusOr<Action> a = ParseAction(e.name);
    if (!a.ok()) continue;
    if (IsCompute(a->type) || IsVocabCompute(a->type)) {
      c.used.insert(a->type);
      c.chunks |= a->stage >= num_stages;
    } else if (e.end > e.start) {
      c.messages_take_time = true;
    }
  }
  return c;
}

// The <svg> element, a white background, the title and the summary line.
void AppendSvgHeader(const SimulationResult& sim, const SvgOptions& options, const SvgLayout& l,
                     std::string* svg) {
  absl::StrAppend(
      svg, absl::StrFormat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                           "viewBox=\"0 0 %d %d\" font-family=\"Helvetica, Arial, sans-serif\">\n"
                           "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                           static_cast<int>(l.width), static_cast<int>(l.height),
                           static_cast<int>(l.width), static_cast<int>(l.height)));
  absl::StrAppend(
      svg,
      absl::StrFormat("<text x=\"%g\" y=\"22\" font-size=\"15\" font-weight=\"bold\">%s</text>\n",
                      l.left, XmlEscape(options.title)));
  absl::StrAppend(
      svg, absl::StrFormat("<text x=\"%g\" y=\"40\" font-size=\"12\" fill=\"#444\">makespan %g, "
                           "bubble %.1f%%, peak in-flight activations [%s]</text>\n",
                           l.left, sim.makespan, 100 * sim.bubble_fraction,
                           absl::StrJoin(sim.peak_inflight, ", ")));
}

// Rows: a light background (idle shows through) and the rank label.
void AppendRankRows(const SvgLayout& l, std::string* svg) {
  for (int r = 0; r < l.ranks; ++r) {
    const double y = l.RowY(r);
    absl::StrAppend(
        svg, absl::StrFormat(
                 "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"#ececec\"/>\n"
                 "<text x=\"%g\" y=\"%g\" font-size=\"13\" text-anchor=\"end\">rank %d</text>\n",
                 l.left, y, l.makespan * l.scale, l.row_height, l.left - 8,
                 y + l.row_height / 2 + 4, r));
  }
}

void AppendTimeAxis(const SvgLayout& l, std::string* svg) {
  const double step = TickStep(l.makespan);
  absl::StrAppend(
      svg, absl::StrFormat("<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#333\"/>\n",
                           l.left, l.axis_y, l.left + l.makespan * l.scale, l.axis_y));
  for (double t = 0; t <= l.makespan + 1e-9; t += step) {
    const double x = l.left + t * l.scale;
    absl::StrAppend(
        svg, absl::StrFormat(
                 "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#333\"/>"
                 "<text x=\"%g\" y=\"%g\" font-size=\"11\" text-anchor=\"middle\">%g</text>\n",
                 x, l.axis_y, x, l.axis_y + 5, x, l.axis_y + 17, t));
  }
  absl::StrAppend(
      svg, absl::StrFormat("<text x=\"%g\" y=\"%g\" font-size=\"11\" fill=\"#444\">time</text>\n",
                           l.left + l.makespan * l.scale + 6, l.axis_y + 4));
}

// Compute actions as coloured boxes with their micro-batch (and chunk) inside;
// messages that take time as thin grey bars along the bottom of the row.
void AppendActionBoxes(const SimulationResult& sim, const SvgLayout& l, int num_stages, bool chunks,
                       std::string* svg) {
  for (const TraceEvent& e : sim.timeline) {
    absl::StatusOr<Action> a = ParseAction(e.name);
    if (!a.ok()) continue;
    const double y = l.RowY(e.rank);
    const double x = l.left + e.start * l.scale;
    const double w = (e.end - e.start) * l.scale;
    if (!IsCompute(a->type) && !IsVocabCompute(a->type)) {
      if (w > 0) {
        absl::StrAppend(
            svg,
            absl::StrFormat("<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"4\" fill=\"#9d9d9d\">"
                            "<title>%s</title></rect>\n",
                            x, y + l.row_height - 4, w, XmlEscape(e.name)));
      }
      continue;
    }
    if (w <= 0) continue;
    const int chunk = a->stage > 0 ? a->stage / num_stages : 0;  // vocabulary passes: -1
    // Later chunks are drawn lighter so that interleaving is visible.
    const double opacity = chunks ? std::max(0.45, 1.0 - 0.3 * chunk) : 1.0;
    absl::StrAppend(
        svg, absl::StrFormat("<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"%s\" "
                             "fill-opacity=\"%g\" stroke=\"white\" stroke-width=\"1\">"
                             "<title>%s [%g, %g)</title></rect>\n",
                             x, y, w, l.row_height, Fill(a->type), opacity, XmlEscape(e.name),
                             e.start, e.end));
    std::string label = chunks && a->stage >= 0 ? absl::StrCat(a->microbatch, ".", chunk)
                                                : absl::StrCat(a->microbatch);
    if (w >= 7.0 * label.size()) {
      absl::StrAppend(svg,
                      absl::StrFormat("<text x=\"%g\" y=\"%g\" font-size=\"12\" fill=\"white\" "
                                      "text-anchor=\"middle\">%s</text>\n",
                                      x + w / 2, y + l.row_height / 2 + 4, label));
    }
  }
}

// OVERLAP_F_B pairs: one outline around both halves (run back to back).
// Returns whether there was a pair (the legend then explains the outline).
bool AppendOverlapPairs(const SimulationResult& sim, const SvgLayout& l, std::string* svg) {
  std::map<std::pair<int, std::string>, std::pair<double, double>> pairs;
  for (const TraceEvent& e : sim.timeline) {
    if (e.overlap.empty()) continue;
    auto [it, inserted] = pairs.insert({{e.rank, e.overlap}, {e.start, e.end}});
    if (!inserted) {
      it->second.first = std::min(it->second.first, e.start);
      it->second.second = std::max(it->second.second, e.end);
    }
  }
  for (const auto& [key, span] : pairs) {
    absl::StrAppend(
        svg,
        absl::StrFormat("<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" "
                        "stroke=\"#222\" stroke-width=\"2\"><title>%s</title></rect>\n",
                        l.left + span.first * l.scale, l.RowY(key.first),
                        (span.second - span.first) * l.scale, l.row_height, XmlEscape(key.second)));
  }
  return !pairs.empty();
}

// One swatch per kind of box drawn, then how to read the labels.
void AppendLegend(const TimelineContents& contents, bool overlap_pairs, const SvgLayout& l,
                  std::string* svg) {
  double lx = l.left;
  const double ly = l.axis_y + 34;
  auto legend = [&](const char* fill, absl::string_view label, double opacity) {
    absl::StrAppend(
        svg,
        absl::StrFormat("<rect x=\"%g\" y=\"%g\" width=\"14\" height=\"14\" fill=\"%s\" "
                        "fill-opacity=\"%g\"/><text x=\"%g\" y=\"%g\" font-size=\"12\">%s</text>\n",
                        lx, ly, fill, opacity, lx + 19, ly + 12, label));
    lx += 40 + 7 * label.size();
  };
  for (const TypeStyle& s : kStyles) {
    if (contents.used.count(s.type)) legend(s.fill, s.label, 1.0);
  }
  if (contents.messages_take_time) legend("#9d9d9d", "message", 1.0);
  if (overlap_pairs) {
    absl::StrAppend(svg, absl::StrFormat("<rect x=\"%g\" y=\"%g\" width=\"14\" height=\"14\" "
                                         "fill=\"none\" stroke=\"#222\" stroke-width=\"2\"/>"
                                         "<text x=\"%g\" y=\"%g\" font-size=\"12\">%s</text>\n",
                                         lx, ly, lx + 19, ly + 12, "OVERLAP_F_B pair"));
    lx += 40 + 7 * 16;
  }
  legend("#ececec", "idle", 1.0);
  if (contents.chunks) {
    absl::StrAppend(
        svg, absl::StrFormat("<text x=\"%g\" y=\"%g\" font-size=\"12\" fill=\"#444\">labels: "
                             "micro-batch.chunk (lighter = later chunk)</text>\n",
                             lx, ly + 12));
  } else {
    absl::StrAppend(
        svg, absl::StrFormat("<text x=\"%g\" y=\"%g\" font-size=\"12\" fill=\"#444\">labels: "
                             "micro-batch</text>\n",
                             lx, ly + 12));
  }
}

}  // namespace

std::string FormatTimelineGrid(const SimulationResult& sim) {
  const int p = static_cast<int>(sim.busy.size());
  std::set<double> times;
  std::vector<std::vector<std::pair<std::string, std::pair<double, double>>>> rows(p);
  for (const TraceEvent& e : sim.timeline) {
    absl::StatusOr<Action> a = ParseAction(e.name);
    if (!a.ok() || !IsCompute(a->type)) continue;
    times.insert(e.start);
    rows[e.rank].push_back({e.name, {e.start, e.end}});
  }
  size_t width = 6;
  for (const auto& row : rows) {
    for (const auto& cell : row) width = std::max(width, cell.first.size());
  }
  std::string out = absl::StrFormat("%7s", "time");
  for (int r = 0; r < p; ++r) {
    out += absl::StrFormat("  %-*s", width, absl::StrCat("rank ", r));
  }
  out += "\n";
  for (double t : times) {
    std::string line = absl::StrFormat("%7g", t);
    for (int r = 0; r < p; ++r) {
      std::string cell;
      for (const auto& [name, span] : rows[r]) {
        if (span.first == t) {
          cell = name;
        } else if (span.first < t && t < span.second) {
          cell = "|";
        }
      }
      line += absl::StrFormat("  %-*s", width, cell);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string RenderSvg(const SimulationResult& sim, const SvgOptions& options) {
  const SvgLayout layout = MakeSvgLayout(sim, options);
  const int num_stages = options.num_stages > 0 ? options.num_stages : layout.ranks;
  const TimelineContents contents = ScanTimeline(sim, num_stages);
  std::string svg;
  AppendSvgHeader(sim, options, layout, &svg);
  AppendRankRows(layout, &svg);
  AppendTimeAxis(layout, &svg);
  AppendActionBoxes(sim, layout, num_stages, contents.chunks, &svg);
  const bool overlap_pairs = AppendOverlapPairs(sim, layout, &svg);
  AppendLegend(contents, overlap_pairs, layout, &svg);
  svg += "</svg>\n";
  return svg;
}

std::string DumpCsv(const RankActions& ranks) {
  std::string out;
  for (const auto& actions : ranks) {
    out += absl::StrJoin(actions, ",", [](std::string* o, const Action& a) {
      absl::StrAppend(o, ActionToString(a));
    });
    out += "\n";
  }
  return out;
}

std::string DumpTimelineCsv(const SimulationResult& sim) {
  const int p = static_cast<int>(sim.busy.size());
  std::vector<double> times;
  std::vector<std::map<double, std::string>> starts(p);
  for (const TraceEvent& e : sim.timeline) {
    absl::StatusOr<Action> a = ParseAction(e.name);
    if (!a.ok() || !IsCompute(a->type)) continue;
    times.push_back(e.start);
    starts[e.rank][e.start] = e.name;
  }
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());
  std::string out;
  for (int r = 0; r < p; ++r) {
    std::vector<std::string> cells;
    for (double t : times) {
      auto it = starts[r].find(t);
      cells.push_back(it == starts[r].end() ? "" : it->second);
    }
    out += absl::StrJoin(cells, ",") + "\n";
  }
  return out;
}

absl::StatusOr<RankActions> LoadCsv(absl::string_view text) {
  RankActions ranks;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  // A trailing newline ends the last row; it does not start a new one.
  if (!lines.empty() && absl::StripAsciiWhitespace(lines.back()).empty()) {
    lines.pop_back();
  }
  for (size_t row = 0; row < lines.size(); ++row) {
    absl::string_view line = absl::StripSuffix(lines[row], "\r");
    std::vector<Action> actions;
    std::vector<absl::string_view> cells = absl::StrSplit(line, ',');
    for (size_t col = 0; col < cells.size(); ++col) {
      absl::string_view cell = absl::StripAsciiWhitespace(cells[col]);
      if (cell.empty()) continue;  // idle step
      absl::StatusOr<Action> action = ParseAction(cell);
      if (!action.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("CSV row ", row, " (rank ", row, ") column ",
                                                       col, ": ", action.status().message()));
      }
      actions.push_back(*action);
    }
    ranks.push_back(std::move(actions));
  }
  return ranks;
}

absl::StatusOr<Schedule> ScheduleFromRankActions(absl::string_view name, const RankActions& ranks) {
  const int p = static_cast<int>(ranks.size());
  if (p == 0) return absl::InvalidArgumentError("no ranks (empty schedule)");
  int max_stage = -1, max_mb = -1;
  bool backward = false;
  for (const auto& actions : ranks) {
    for (const Action& action : actions) {
      for (const Action& a : Leaves(action)) {  // both halves of an OVERLAP_F_B
        max_stage = std::max(max_stage, a.stage);
        max_mb = std::max(max_mb, a.microbatch);
        backward |= a.type != ActionType::kForward;
      }
    }
  }
  if (max_stage < 0 || max_mb < 0) {
    return absl::InvalidArgumentError("the schedule has no compute action");
  }
  if ((max_stage + 1) % p != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages 0..", max_stage, " do not fill whole chunks of ", p,
                     " ranks (the looped placement needs a multiple of ", p, " stages)"));
  }
  Schedule schedule =
      EmptyLoopedSchedule(name, ScheduleOptions{p, max_mb + 1, (max_stage + 1) / p, 0});
  schedule.forward_only = !backward;
  schedule.ranks = ranks;
  return schedule;
}

}  // namespace pp
