// A static picture of a Chrome trace: one SVG with a process lane per pid, a
// track per thread, spans stacked by nesting and a millisecond ruler. Made for
// the merged profile of trace_merge.h (each rank a lane, pipe's actions in the
// top track, LibTorch's operators below), where no trace viewer is at hand
// (Perfetto's UI needs the network; headless Chromium loads no chrome:// page).
//
// What is drawn: complete ("X") events in the time window. A span at least
// `min_span_px` wide is a rectangle with its name (when it fits) and a tooltip
// (<title>: name, duration, pipe_action); narrower spans are not dropped but
// drawn as grey "coverage" runs at their depth, so a stretch of many tiny
// operators stays visible as busy. Spans deeper than `max_depth` are counted,
// not drawn. Metadata events name and order lanes and tracks
// (process_name/thread_name, *_sort_index); other phases are ignored.
// No LibTorch here.
#ifndef OBSERVABILITY_TRACE_SVG_H_
#define OBSERVABILITY_TRACE_SVG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pp {

struct TraceSvgOptions {
  // The window, in the trace's microseconds. Unset: `step`'s window if set,
  // else from the earliest start to the latest end of all complete events.
  std::optional<double> start_us;
  std::optional<double> end_us;
  // The window of "ProfilerStep#<step>" spans (earliest start to latest end
  // over all lanes), as OperatorProfiler writes them.
  std::optional<int64_t> step;
  int width_px = 1600;  // the whole picture; the time axis gets what the labels leave
  int max_depth = 8;    // nesting levels drawn per track (0 = the outermost spans)
  double min_span_px = 1.0;
  std::string title;  // drawn above the ruler when not empty
};

// One drawn rectangle (a span, or a coverage run when `coverage`).
struct TraceBox {
  int pid = 0;
  int64_t tid = 0;
  int depth = 0;
  double x = 0, y = 0, width = 0, height = 0;
  std::string name;  // empty for coverage
  std::string category;
  double start_us = 0, duration_us = 0;
  std::string pipe_action;  // args.pipe_action, if any
  bool coverage = false;
};

struct TraceTrack {
  int pid = 0;
  int64_t tid = 0;
  std::string lane_name;   // process_name, else "pid <pid>"
  std::string track_name;  // thread_name, else "tid <tid>"
  double y = 0, height = 0;
  int depths = 0;  // levels drawn
};

struct TraceLayout {
  double width = 0, height = 0;
  double plot_x = 0, plot_width = 0;  // the time axis: x = plot_x + (t - start) * scale
  double start_us = 0, end_us = 0;
  std::vector<TraceTrack> tracks;  // top to bottom
  std::vector<TraceBox> boxes;
  int64_t spans_in_window = 0;  // complete events overlapping the window
  int64_t spans_too_deep = 0;   // of those, deeper than max_depth (not drawn)
  std::string title;
};

// Lays out `trace_json` (a Chrome trace object with "traceEvents", or a bare
// event array). InvalidArgument naming the value for text that is not a Chrome
// trace, a window that is empty or inverted, a step with no ProfilerStep spans,
// width_px < 300, max_depth < 0, min_span_px < 0, or a window holding no
// complete event.
absl::StatusOr<TraceLayout> LayoutTrace(absl::string_view trace_json,
                                        const TraceSvgOptions& options = {});

// The SVG document of a layout (self-contained, no scripts or external fonts).
std::string RenderTraceSvg(const TraceLayout& layout);

// LayoutTrace + RenderTraceSvg.
absl::StatusOr<std::string> TraceToSvg(absl::string_view trace_json,
                                       const TraceSvgOptions& options = {});

}  // namespace pp

#endif  // OBSERVABILITY_TRACE_SVG_H_
