// trace_to_svg: a Chrome trace (e.g. a run's profile/merged.json) as one SVG.
//
//   ./bazelw run //observability:trace_to_svg --
//       --trace=$PWD/runs/<run>/profile/merged.json --out=$PWD/merged.svg --step=200
//       --title="gpt_small_pp2, step 200"
//
// Open the SVG in a browser (hover a span for its name, duration and pipe
// action), or screenshot it: chromium --headless --screenshot=x.png file://...
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "observability/trace_svg.h"

ABSL_FLAG(std::string, trace, "", "the Chrome trace JSON to draw");
ABSL_FLAG(std::string, out, "", "where to write the SVG");
ABSL_FLAG(int64_t, step, -1, "draw the window of this ProfilerStep#N (-1: the whole trace)");
ABSL_FLAG(double, start_ms, -1,
          "window start, ms after the step's (or trace's) first event; -1: that event");
ABSL_FLAG(double, end_ms, -1, "window end, ms after the same origin; -1: the last event's end");
ABSL_FLAG(int, width, 1600, "picture width in px");
ABSL_FLAG(int, max_depth, 8, "nesting levels drawn per track");
ABSL_FLAG(double, min_span_px, 1.0,
          "narrower spans are drawn as grey coverage (0: every span as itself)");
ABSL_FLAG(std::string, title, "", "title above the ruler");

namespace pp {
namespace {

absl::Status Run() {
  const std::string path = absl::GetFlag(FLAGS_trace);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (path.empty() || out.empty()) {
    return absl::InvalidArgumentError("--trace and --out are required");
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read --trace=", path));
  std::stringstream text;
  text << in.rdbuf();
  TraceSvgOptions options;
  options.width_px = absl::GetFlag(FLAGS_width);
  options.max_depth = absl::GetFlag(FLAGS_max_depth);
  options.min_span_px = absl::GetFlag(FLAGS_min_span_px);
  options.title = absl::GetFlag(FLAGS_title);
  if (absl::GetFlag(FLAGS_step) >= 0) options.step = absl::GetFlag(FLAGS_step);
  const double start_ms = absl::GetFlag(FLAGS_start_ms);
  const double end_ms = absl::GetFlag(FLAGS_end_ms);
  if (start_ms >= 0 || end_ms >= 0) {
    // Relative to the default window's start.
    absl::StatusOr<TraceLayout> whole = LayoutTrace(text.str(), options);
    if (!whole.ok()) return whole.status();
    if (start_ms >= 0) options.start_us = whole->start_us + start_ms * 1000;
    if (end_ms >= 0) options.end_us = whole->start_us + end_ms * 1000;
  }
  absl::StatusOr<std::string> svg = TraceToSvg(text.str(), options);
  if (!svg.ok()) return svg.status();
  std::ofstream file(out);
  file << *svg;
  file.close();
  if (!file) return absl::InternalError(absl::StrCat("cannot write --out=", out));
  return absl::OkStatus();
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = pp::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "trace_to_svg: %s\n", status.ToString().c_str());  // the tool's verdict
    return 1;
  }
  return 0;
}
