#include "observability/trace_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/xml_escape.h"

namespace pp {
namespace {

using nlohmann::json;

// Geometry, in SVG pixels.
constexpr double kGutter = 240;      // track labels left of the time axis
constexpr double kRightMargin = 16;  // after the time axis
constexpr double kTitleHeight = 26;
constexpr double kRulerHeight = 26;
constexpr double kLaneHeader = 20;  // the lane's name row
constexpr double kRow = 15;         // one nesting level
constexpr double kTrackGap = 4;
constexpr double kLaneGap = 10;
constexpr double kFooter = 46;      // legend and counts
constexpr double kCharWidth = 5.8;  // 10 px sans-serif, an upper estimate

struct Event {
  int pid = 0;
  int64_t tid = 0;
  double ts = 0, dur = 0;
  std::string name, category, pipe_action;
};

absl::StatusOr<json> ParseEvents(absl::string_view text) {
  json trace;
  try {
    trace = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the trace is not JSON: ", e.what()));
  }
  if (trace.is_object() && trace.contains("traceEvents")) trace = trace["traceEvents"];
  if (!trace.is_array()) {
    return absl::InvalidArgumentError(
        "the trace is not a Chrome trace (neither a \"traceEvents\" array nor an event array)");
  }
  return trace;
}

// Integer-valued JSON number (Chrome traces may write pid/tid as 1.0).
std::optional<int64_t> AsInteger(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::floor(d) == d && std::abs(d) < 9e15) return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

// Pipe's schedule actions have fixed colours (the categories of
// pipeline/schedule/ir/chrome_trace.h); everything else one per name.
std::string ColorOf(const TraceBox& box) {
  const std::string& c = box.category;
  if (c == "F") return "#4c78a8";
  if (c == "B" || c == "I") return "#f58518";
  if (c == "W") return "#eeca3b";
  if (absl::StartsWith(c, "SEND")) return "#54a24b";
  if (absl::StartsWith(c, "RECV")) return "#9ecae9";
  if (c == "REDUCE_GRAD" || c == "REDUCE_TIED" || c == "STEP") return "#b279a2";
  if (c == "step") return "#e6e6e6";
  uint32_t h = 2166136261u;  // FNV-1a of the name
  for (char ch : box.name) h = (h ^ static_cast<unsigned char>(ch)) * 16777619u;
  const int hue = static_cast<int>(h % 360);
  return absl::StrFormat("hsl(%d,45%%,%d%%)", hue, c == "backward" ? 66 : 76);
}

std::string FormatMs(double ms) {
  if (ms == 0) return "0";
  if (std::abs(ms) >= 100) return absl::StrFormat("%.0f", ms);
  if (std::abs(ms) >= 10) return absl::StrFormat("%.1f", ms);
  if (std::abs(ms) >= 1) return absl::StrFormat("%.2f", ms);
  return absl::StrFormat("%.3f", ms);
}

// The label that fits in `width` px, shortened with "..", or empty.
std::string FitLabel(const std::string& name, double width) {
  const int fits = static_cast<int>((width - 4) / kCharWidth);
  if (fits >= static_cast<int>(name.size())) return name;
  if (fits < 4) return "";
  return name.substr(0, fits - 2) + "..";
}

using TrackKey = std::pair<int, int64_t>;  // (pid, tid)

absl::Status CheckOptions(const TraceSvgOptions& options) {
  if (options.width_px < 300) {
    return absl::InvalidArgumentError(
        absl::StrCat("width_px ", options.width_px, " is too small; must be >= 300"));
  }
  if (options.max_depth < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_depth ", options.max_depth, " must be >= 0"));
  }
  if (!(options.min_span_px >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_span_px ", options.min_span_px, " must be >= 0"));
  }
  return absl::OkStatus();
}

// A trace's complete ("X") events, and the names and sort order its metadata
// ("M") events give processes (lanes) and threads (tracks).
struct TraceEvents {
  std::vector<Event> spans;
  std::map<int, std::string> lane_names;
  std::map<int, int64_t> lane_order;
  std::map<TrackKey, std::string> track_names;
  std::map<TrackKey, int64_t> track_order;
};

absl::StatusOr<TraceEvents> ReadEvents(const json& events) {
  TraceEvents read;
  std::vector<Event>& spans = read.spans;
  std::map<int, std::string>& lane_names = read.lane_names;
  std::map<int, int64_t>& lane_order = read.lane_order;
  std::map<TrackKey, std::string>& track_names = read.track_names;
  std::map<TrackKey, int64_t>& track_order = read.track_order;
  for (size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    if (!e.is_object()) continue;
    const std::string ph = e.contains("ph") && e["ph"].is_string() ? e["ph"] : "";
    if (ph != "X" && ph != "M") continue;
    const std::optional<int64_t> pid = e.contains("pid") ? AsInteger(e["pid"]) : std::nullopt;
    const std::optional<int64_t> tid =
        e.contains("tid") ? AsInteger(e["tid"]) : std::optional<int64_t>(0);
    if (!pid.has_value() || !tid.has_value() || *pid < std::numeric_limits<int>::min() ||
        *pid > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trace event ", i, " (", e.dump().substr(0, 120), "): pid and tid must be integers"));
    }
    const int p = static_cast<int>(*pid);
    const std::string name = e.contains("name") && e["name"].is_string() ? e["name"] : "";
    if (ph == "M") {
      const json args = e.value("args", json::object());
      if (name == "process_name" && args.contains("name") && args["name"].is_string()) {
        lane_names[p] = args["name"];
      } else if (name == "process_sort_index" && args.contains("sort_index")) {
        if (auto v = AsInteger(args["sort_index"])) lane_order[p] = *v;
      } else if (name == "thread_name" && args.contains("name") && args["name"].is_string()) {
        track_names[{p, *tid}] = args["name"];
      } else if (name == "thread_sort_index" && args.contains("sort_index")) {
        if (auto v = AsInteger(args["sort_index"])) track_order[{p, *tid}] = *v;
      }
      continue;
    }
    if (!e.contains("ts") || !e["ts"].is_number() || (e.contains("dur") && !e["dur"].is_number())) {
      return absl::InvalidArgumentError(
          absl::StrCat("trace event ", i, " (", e.dump().substr(0, 120),
                       "): a complete event needs numeric ts and dur"));
    }
    Event span;
    span.pid = p;
    span.tid = *tid;
    span.ts = e["ts"].get<double>();
    span.dur = std::max(0.0, e.value("dur", 0.0));
    span.name = name;
    span.category = e.contains("cat") && e["cat"].is_string() ? e["cat"] : "";
    if (e.contains("args") && e["args"].is_object() && e["args"].contains("pipe_action") &&
        e["args"]["pipe_action"].is_string()) {
      span.pipe_action = e["args"]["pipe_action"];
    }
    spans.push_back(std::move(span));
  }
  if (spans.empty()) return absl::InvalidArgumentError("the trace has no complete (\"X\") events");
  return read;
}

// The window [start, end] in us: the step's ProfilerStep span, or all spans;
// the options' start_us/end_us override either end.
absl::StatusOr<std::pair<double, double>> ChooseWindow(const std::vector<Event>& spans,
                                                       const TraceSvgOptions& options) {
  double start = std::numeric_limits<double>::max();
  double end = std::numeric_limits<double>::lowest();
  if (options.step.has_value()) {
    const std::string step_name = absl::StrCat("ProfilerStep#", *options.step);
    std::set<std::string> steps;
    for (const Event& s : spans) {
      if (s.name == step_name) {
        start = std::min(start, s.ts);
        end = std::max(end, s.ts + s.dur);
      } else if (absl::StartsWith(s.name, "ProfilerStep#")) {
        steps.insert(s.name.substr(13));
      }
    }
    if (start > end) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", *options.step, " has no \"", step_name,
                       "\" span in the trace; its steps: [", absl::StrJoin(steps, ", "), "]"));
    }
  } else {
    for (const Event& s : spans) {
      start = std::min(start, s.ts);
      end = std::max(end, s.ts + s.dur);
    }
  }
  if (options.start_us.has_value()) start = *options.start_us;
  if (options.end_us.has_value()) end = *options.end_us;
  if (!(end > start)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the window [%.3f, %.3f] us is empty or inverted; its end must be after its start", start,
        end));
  }
  return std::make_pair(start, end);
}

// Each span's nesting level in its track: a span starts one level below every
// still-open span before it. Sorts `track_spans` by start (longer first).
std::vector<int> NestingDepths(std::vector<Event>& track_spans) {
  std::stable_sort(track_spans.begin(), track_spans.end(), [](const Event& a, const Event& b) {
    return a.ts != b.ts ? a.ts < b.ts : a.dur > b.dur;
  });
  std::vector<double> open_ends;
  std::vector<int> depth(track_spans.size());
  for (size_t i = 0; i < track_spans.size(); ++i) {
    const Event& s = track_spans[i];
    while (!open_ends.empty() && open_ends.back() <= s.ts) open_ends.pop_back();
    depth[i] = static_cast<int>(open_ends.size());
    open_ends.push_back(s.ts + s.dur);
  }
  return depth;
}

// The boxes of one track at height `y`: one per span at most max_depth deep
// and at least min_span_px wide; the narrower ones mark the pixel columns
// they touch, per level, and each run of marked columns becomes one coverage
// box. `scale`: pixels per us.
void AddTrackBoxes(const TrackKey& key, const std::vector<Event>& track_spans,
                   const std::vector<int>& depth, const TraceTrack& track, double y, double scale,
                   const TraceSvgOptions& options, TraceLayout& layout) {
  const double start = layout.start_us;
  const double end = layout.end_us;
  // Spans too narrow to draw mark the pixel columns they touch, per level.
  const int columns = static_cast<int>(std::ceil(layout.plot_width)) + 1;
  std::vector<std::vector<bool>> covered(track.depths, std::vector<bool>(columns, false));
  for (size_t i = 0; i < track_spans.size(); ++i) {
    if (depth[i] > options.max_depth) continue;
    const Event& s = track_spans[i];
    const double x0 = (std::max(s.ts, start) - start) * scale;
    const double x1 = (std::min(s.ts + s.dur, end) - start) * scale;
    if (x1 - x0 < options.min_span_px) {
      const int c0 = std::clamp(static_cast<int>(std::floor(x0)), 0, columns - 1);
      const int c1 = std::clamp(static_cast<int>(std::floor(x1)), 0, columns - 1);
      for (int c = c0; c <= c1; ++c) covered[depth[i]][c] = true;
      continue;
    }
    TraceBox box;
    box.pid = s.pid;
    box.tid = s.tid;
    box.depth = depth[i];
    box.x = layout.plot_x + x0;
    box.y = y + depth[i] * kRow;
    box.width = x1 - x0;
    box.height = kRow - 1;
    box.name = s.name;
    box.category = s.category;
    box.start_us = s.ts;
    box.duration_us = s.dur;
    box.pipe_action = s.pipe_action;
    layout.boxes.push_back(std::move(box));
  }
  for (int d = 0; d < track.depths; ++d) {
    for (int c = 0; c < columns;) {
      if (!covered[d][c]) {
        ++c;
        continue;
      }
      int run_end = c;
      while (run_end < columns && covered[d][run_end]) ++run_end;
      TraceBox box;
      box.pid = key.first;
      box.tid = key.second;
      box.depth = d;
      box.x = layout.plot_x + c;
      box.y = y + d * kRow;
      box.width = run_end - c;
      box.height = kRow - 1;
      box.coverage = true;
      box.start_us = start + c / scale;
      box.duration_us = (run_end - c) / scale;
      layout.boxes.push_back(std::move(box));
      c = run_end;
    }
  }
}

}  // namespace

absl::StatusOr<TraceLayout> LayoutTrace(absl::string_view trace_json,
                                        const TraceSvgOptions& options) {
  PP_RETURN_IF_ERROR(CheckOptions(options));
  PP_ASSIGN_OR_RETURN(json events, ParseEvents(trace_json));
  PP_ASSIGN_OR_RETURN(TraceEvents read, ReadEvents(events));
  PP_ASSIGN_OR_RETURN(const auto window, ChooseWindow(read.spans, options));
  const auto [start, end] = window;

  TraceLayout layout;
  layout.title = options.title;
  layout.start_us = start;
  layout.end_us = end;
  layout.width = options.width_px;
  layout.plot_x = kGutter;
  layout.plot_width = options.width_px - kGutter - kRightMargin;
  const double scale = layout.plot_width / (end - start);

  // Tracks in lane order, each with its spans sorted for nesting.
  std::map<TrackKey, std::vector<Event>> by_track;
  for (Event& s : read.spans) {
    const bool overlaps = s.ts < end && s.ts + s.dur > start;
    const bool instant_inside = s.dur == 0 && s.ts >= start && s.ts <= end;
    if (!overlaps && !instant_inside) continue;
    ++layout.spans_in_window;
    by_track[{s.pid, s.tid}].push_back(std::move(s));
  }
  if (by_track.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the window [%.3f, %.3f] us holds no complete event of the trace", start, end));
  }
  std::vector<TrackKey> order;
  for (const auto& [key, unused] : by_track) order.push_back(key);
  auto lane_rank = [&](int pid) {
    auto it = read.lane_order.find(pid);
    return it == read.lane_order.end() ? static_cast<int64_t>(pid) : it->second;
  };
  auto track_rank = [&](const TrackKey& key) {
    auto it = read.track_order.find(key);
    return it == read.track_order.end() ? key.second : it->second;
  };
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    return std::make_tuple(lane_rank(a.first), a.first, track_rank(a), a.second) <
           std::make_tuple(lane_rank(b.first), b.first, track_rank(b), b.second);
  });

  double y = options.title.empty() ? 0 : kTitleHeight;
  y += kRulerHeight;
  int previous_pid = 0;
  bool first = true;
  for (const auto& key : order) {
    std::vector<Event>& track_spans = by_track[key];
    if (first || key.first != previous_pid) {
      if (!first) y += kLaneGap;
      y += kLaneHeader;
      first = false;
      previous_pid = key.first;
    }
    const std::vector<int> depth = NestingDepths(track_spans);
    int deepest = 0;
    for (int d : depth) {
      if (d > options.max_depth) {
        ++layout.spans_too_deep;
      } else {
        deepest = std::max(deepest, d);
      }
    }
    TraceTrack track;
    track.pid = key.first;
    track.tid = key.second;
    auto lane_name = read.lane_names.find(key.first);
    track.lane_name =
        lane_name != read.lane_names.end() ? lane_name->second : absl::StrCat("pid ", key.first);
    auto track_name = read.track_names.find(key);
    track.track_name = track_name != read.track_names.end() ? track_name->second
                                                            : absl::StrCat("tid ", key.second);
    track.y = y;
    track.depths = deepest + 1;
    track.height = track.depths * kRow;

    AddTrackBoxes(key, track_spans, depth, track, y, scale, options, layout);
    layout.tracks.push_back(std::move(track));
    y += layout.tracks.back().height + kTrackGap;
  }
  layout.height = y + kFooter;
  return layout;
}

namespace {

// RenderTraceSvg's steps, each appending one part in drawing order.

// The <svg> element, a white background and the title. Returns the ruler's
// top.
double AppendTraceHeader(const TraceLayout& layout, std::string& out) {
  absl::StrAppendFormat(&out,
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                        "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
                        "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                        layout.width, layout.height, layout.width, layout.height);
  if (layout.title.empty()) return 0;
  absl::StrAppendFormat(&out,
                        "<text x=\"8\" y=\"18\" font-size=\"14\" font-weight=\"bold\">%s</text>\n",
                        XmlEscape(layout.title));
  return kTitleHeight;
}

// Ruler: about ten ticks of 1, 2 or 5 x 10^k ms from the window's start, with
// grid lines down to the footer.
void AppendRuler(const TraceLayout& layout, double y, std::string& out) {
  const double range_ms = (layout.end_us - layout.start_us) / 1000;
  const double raw = range_ms / 10;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  const double step = raw / magnitude < 1.5   ? magnitude
                      : raw / magnitude < 3.5 ? 2 * magnitude
                      : raw / magnitude < 7.5 ? 5 * magnitude
                                              : 10 * magnitude;
  const double scale = layout.plot_width / range_ms;  // px per ms
  const double grid_bottom = layout.height - kFooter;
  absl::StrAppendFormat(&out, "<text x=\"8\" y=\"%.1f\" fill=\"#555\">time (ms)</text>\n", y + 16);
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  for (int i = 0; i * step <= range_ms * (1 + 1e-9); ++i) {
    const double x = layout.plot_x + i * step * scale;
    absl::StrAppendFormat(
        &out,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
        "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\" text-anchor=\"middle\">%s</text>\n",
        x, y + kRulerHeight - 4, x, grid_bottom, x, y + 16,
        absl::StrFormat("%.*f", decimals, i * step));
  }
}

// Lane bands and names, track names.
void AppendLanesAndTracks(const TraceLayout& layout, std::string& out) {
  for (size_t i = 0; i < layout.tracks.size(); ++i) {
    const TraceTrack& t = layout.tracks[i];
    if (i == 0 || layout.tracks[i - 1].pid != t.pid) {
      double lane_bottom = t.y + t.height;
      for (size_t j = i; j < layout.tracks.size() && layout.tracks[j].pid == t.pid; ++j) {
        lane_bottom = layout.tracks[j].y + layout.tracks[j].height;
      }
      absl::StrAppendFormat(
          &out,
          "<rect x=\"0\" y=\"%.1f\" width=\"%.0f\" height=\"%.1f\" "
          "fill=\"#f4f6fa\" stroke=\"#c9d1de\"/>\n"
          "<text x=\"8\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">%s</text>\n",
          t.y - kLaneHeader, layout.width, lane_bottom - t.y + kLaneHeader + 2, t.y - 6,
          XmlEscape(t.lane_name));
    }
    absl::StrAppendFormat(&out, "<text x=\"16\" y=\"%.1f\" fill=\"#333\">%s</text>\n", t.y + 11,
                          XmlEscape(FitLabel(t.track_name, kGutter - 20)));
  }
}

// Coverage first, spans over it.
void AppendBoxes(const TraceLayout& layout, std::string& out) {
  for (int pass = 0; pass < 2; ++pass) {
    for (const TraceBox& b : layout.boxes) {
      if (b.coverage != (pass == 0)) continue;
      if (b.coverage) {
        absl::StrAppendFormat(&out,
                              "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
                              "fill=\"#c4c4c4\"><title>spans under 1 px</title></rect>\n",
                              b.x, b.y, b.width, b.height);
        continue;
      }
      std::string tip = absl::StrFormat("%s  %s ms", b.name, FormatMs(b.duration_us / 1000));
      if (!b.pipe_action.empty()) absl::StrAppend(&tip, "  in ", b.pipe_action);
      absl::StrAppendFormat(
          &out,
          "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
          "fill=\"%s\" stroke=\"#fff\" stroke-width=\"0.5\"><title>%s</title></rect>\n",
          b.x, b.y, b.width, b.height, ColorOf(b), XmlEscape(tip));
      const std::string label = FitLabel(b.name, b.width);
      if (!label.empty()) {
        absl::StrAppendFormat(
            &out, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"10\" fill=\"#111\">%s</text>\n", b.x + 2,
            b.y + 10.5, XmlEscape(label));
      }
    }
  }
}

// Legend and counts, below the grid.
void AppendTraceLegend(const TraceLayout& layout, std::string& out) {
  const std::vector<std::pair<std::string, std::string>> legend = {
      {"#4c78a8", "F"},
      {"#f58518", "B / I"},
      {"#eeca3b", "W"},
      {"#54a24b", "SEND"},
      {"#9ecae9", "RECV (waiting)"},
      {"#b279a2", "reduce / optimizer step"},
      {"#c4c4c4", "spans under 1 px"},
      {"hsl(280,45%,76%)", "operators: one colour per name"}};
  double x = 8;
  const double legend_y = layout.height - kFooter + 10;
  for (const auto& [color, text] : legend) {
    absl::StrAppendFormat(&out,
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                          x, legend_y, color, x + 16, legend_y + 10, XmlEscape(text));
    x += 16 + kCharWidth * 1.15 * text.size() + 18;
  }
  absl::StrAppendFormat(
      &out,
      "<text x=\"8\" y=\"%.1f\" fill=\"#555\">0 ms = %.0f us on the trace's clock; "
      "%d spans in the window%s; hover a span for its name, duration and "
      "pipe action</text>\n",
      legend_y + 28, layout.start_us, layout.spans_in_window,
      layout.spans_too_deep > 0
          ? absl::StrCat(", ", layout.spans_too_deep, " nested deeper than drawn")
          : std::string());
}

}  // namespace

std::string RenderTraceSvg(const TraceLayout& layout) {
  std::string out;
  const double ruler_y = AppendTraceHeader(layout, out);
  AppendRuler(layout, ruler_y, out);
  AppendLanesAndTracks(layout, out);
  AppendBoxes(layout, out);
  AppendTraceLegend(layout, out);
  out += "</svg>\n";
  return out;
}

absl::StatusOr<std::string> TraceToSvg(absl::string_view trace_json,
                                       const TraceSvgOptions& options) {
  PP_ASSIGN_OR_RETURN(TraceLayout layout, LayoutTrace(trace_json, options));
  return RenderTraceSvg(layout);
}

}  // namespace pp
