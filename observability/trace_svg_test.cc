#include "observability/trace_svg.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "observability/trace_merge.h"

namespace pp {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json Meta(const std::string& what, int pid, int tid, const json& value) {
  json e = {{"name", what}, {"ph", "M"}, {"pid", pid}, {"args", json::object()}};
  if (what.rfind("thread", 0) == 0) e["tid"] = tid;
  e["args"][what.find("sort") != std::string::npos ? "sort_index" : "name"] = value;
  return e;
}

json Span(const std::string& name, const std::string& cat, int pid, int tid, double ts, double dur,
          const std::string& pipe_action = "") {
  json e = {{"name", name}, {"cat", cat}, {"ph", "X"}, {"pid", pid},
            {"tid", tid},   {"ts", ts},   {"dur", dur}};
  if (!pipe_action.empty()) e["args"] = {{"pipe_action", pipe_action}};
  return e;
}

// Two ranks as trace_merge.h writes them, listed out of order: rank 1's lane
// and events first, each lane's operator track before its action track.
std::string TwoRanks() {
  json events = json::array();
  for (int pid : {1, 0}) {
    events.push_back(Meta("process_name", pid, 0, "rank " + std::to_string(pid)));
    events.push_back(Meta("process_sort_index", pid, 0, pid));
    events.push_back(Meta("thread_name", pid, 1, "operators (LibTorch thread 1)"));
    events.push_back(Meta("thread_sort_index", pid, 1, 1));
    events.push_back(Meta("thread_name", pid, 0, "pipe actions"));
    events.push_back(Meta("thread_sort_index", pid, 0, 0));
  }
  events.push_back(Span("1F0", "F", 1, 0, 1000, 1000));
  events.push_back(Span("aten::relu", "cpu_op", 1, 1, 1100, 500, "1F0"));
  events.push_back(Span("0F0", "F", 0, 0, 0, 1000));
  events.push_back(Span("0SEND_F0", "SEND_F", 0, 0, 1000, 100));
  events.push_back(Span("aten::addmm", "cpu_op", 0, 1, 100, 800, "0F0"));
  events.push_back(Span("aten::mm", "cpu_op", 0, 1, 200, 600, "0F0"));
  events.push_back(Span("0B0", "B", 0, 0, 2000, 2000));
  return json{{"traceEvents", events}}.dump();
}

const TraceBox* Box(const TraceLayout& layout, const std::string& name) {
  for (const TraceBox& b : layout.boxes) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

TEST(TraceSvgTest, RanksAreLanesInSortOrderWithActionsAboveOperators) {
  TraceSvgOptions options;
  options.width_px = 1256;  // a 1000 px time axis
  absl::StatusOr<TraceLayout> layout = LayoutTrace(TwoRanks(), options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->tracks.size(), 4u);
  const std::vector<std::pair<int, int64_t>> expected = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(layout->tracks[i].pid, expected[i].first) << i;
    EXPECT_EQ(layout->tracks[i].tid, expected[i].second) << i;
    EXPECT_EQ(layout->tracks[i].lane_name, "rank " + std::to_string(expected[i].first));
    if (i > 0) {
      EXPECT_GT(layout->tracks[i].y, layout->tracks[i - 1].y) << i;
    }
  }
  EXPECT_EQ(layout->tracks[0].track_name, "pipe actions");
  EXPECT_EQ(layout->tracks[1].track_name, "operators (LibTorch thread 1)");
  EXPECT_EQ(layout->tracks[1].depths, 2);  // addmm and the mm inside it

  EXPECT_DOUBLE_EQ(layout->start_us, 0);
  EXPECT_DOUBLE_EQ(layout->end_us, 4000);
  EXPECT_DOUBLE_EQ(layout->plot_width, 1000);
  EXPECT_EQ(layout->spans_in_window, 7);
  const TraceBox* f = Box(*layout, "0F0");
  const TraceBox* addmm = Box(*layout, "aten::addmm");
  const TraceBox* mm = Box(*layout, "aten::mm");
  const TraceBox* b = Box(*layout, "0B0");
  const TraceBox* relu = Box(*layout, "aten::relu");
  ASSERT_TRUE(f && addmm && mm && b && relu);
  // Time maps linearly onto the axis: 4000 us over 1000 px.
  EXPECT_DOUBLE_EQ(f->x, layout->plot_x);
  EXPECT_DOUBLE_EQ(f->width, 250);
  EXPECT_DOUBLE_EQ(addmm->x, layout->plot_x + 25);
  EXPECT_DOUBLE_EQ(addmm->width, 200);
  EXPECT_DOUBLE_EQ(b->x, layout->plot_x + 500);
  // The action sits above the operators it ran, nested operators below their parent.
  EXPECT_LT(f->y + f->height, addmm->y);
  EXPECT_EQ(addmm->depth, 0);
  EXPECT_EQ(mm->depth, 1);
  EXPECT_GT(mm->y, addmm->y);
  EXPECT_EQ(mm->pipe_action, "0F0");
  EXPECT_EQ(f->category, "F");
  // Rank 1's lane is below all of rank 0's.
  EXPECT_GT(relu->y, mm->y);
  EXPECT_GT(Box(*layout, "1F0")->y, mm->y);
}

TEST(TraceSvgTest, StepWindowClipsAndDropsWhatIsOutside) {
  json events = json::array();
  events.push_back(Span("ProfilerStep#4", "step", 0, 1, 0, 1000));
  events.push_back(Span("ProfilerStep#5", "step", 0, 1, 1000, 1000));
  events.push_back(Span("ProfilerStep#5", "step", 1, 1, 1200, 1000));  // ends at 2200
  events.push_back(Span("before", "cpu_op", 0, 1, 100, 100));
  events.push_back(Span("across", "cpu_op", 0, 1, 900, 400));  // 900..1300
  events.push_back(Span("inside", "cpu_op", 1, 1, 1500, 100));
  events.push_back(Span("after", "cpu_op", 1, 1, 3000, 100));
  TraceSvgOptions options;
  options.step = 5;
  options.width_px = 1256;
  absl::StatusOr<TraceLayout> layout = LayoutTrace(json{{"traceEvents", events}}.dump(), options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_DOUBLE_EQ(layout->start_us, 1000);
  EXPECT_DOUBLE_EQ(layout->end_us, 2200);
  EXPECT_EQ(Box(*layout, "before"), nullptr);
  EXPECT_EQ(Box(*layout, "after"), nullptr);
  EXPECT_EQ(Box(*layout, "ProfilerStep#4"), nullptr);
  const TraceBox* across = Box(*layout, "across");
  ASSERT_NE(across, nullptr);
  EXPECT_DOUBLE_EQ(across->x, layout->plot_x);  // clipped at the window's start
  EXPECT_NEAR(across->width, 300.0 / 1200 * 1000, 1e-9);
  ASSERT_NE(Box(*layout, "inside"), nullptr);
  EXPECT_EQ(layout->spans_in_window, 4);  // two step spans, across, inside

  // An explicit window wins over the step's.
  options.start_us = 1400;
  options.end_us = 1700;
  layout = LayoutTrace(json{{"traceEvents", events}}.dump(), options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(Box(*layout, "across"), nullptr);
  EXPECT_NE(Box(*layout, "inside"), nullptr);
}

TEST(TraceSvgTest, SpansNarrowerThanAPixelBecomeCoverageNotGaps) {
  json events = json::array();
  events.push_back(Span("0F0", "F", 0, 0, 0, 1'000'000));
  for (int i = 0; i < 200; ++i) {  // 200 operators of 2 us each, from 500 ms on
    events.push_back(Span("aten::tiny", "cpu_op", 0, 1, 500'000 + 10 * i, 2));
  }
  TraceSvgOptions options;
  options.width_px = 1256;  // 1000 us per px
  absl::StatusOr<TraceLayout> layout = LayoutTrace(json{{"traceEvents", events}}.dump(), options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(Box(*layout, "aten::tiny"), nullptr);
  std::vector<const TraceBox*> coverage;
  for (const TraceBox& b : layout->boxes) {
    if (b.coverage) coverage.push_back(&b);
  }
  // 500,000..501,992 us: pixel columns 500 and 501, one run.
  ASSERT_EQ(coverage.size(), 1u);
  EXPECT_EQ(coverage[0]->tid, 1);
  EXPECT_DOUBLE_EQ(coverage[0]->x, layout->plot_x + 500);
  EXPECT_DOUBLE_EQ(coverage[0]->width, 2);
  EXPECT_THAT(RenderTraceSvg(*layout), HasSubstr("spans under 1 px"));

  options.min_span_px = 0;  // draw everything as itself
  layout = LayoutTrace(json{{"traceEvents", events}}.dump(), options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(std::count_if(layout->boxes.begin(), layout->boxes.end(),
                          [](const TraceBox& b) { return b.name == "aten::tiny"; }),
            200);
}

TEST(TraceSvgTest, MaxDepthCountsWhatItDoesNotDraw) {
  json events = json::array();
  events.push_back(Span("outer", "cpu_op", 0, 1, 0, 1000));
  events.push_back(Span("middle", "cpu_op", 0, 1, 100, 800));
  events.push_back(Span("inner", "cpu_op", 0, 1, 200, 600));
  events.push_back(Span("next", "cpu_op", 0, 1, 1000, 500));  // starts as outer ends
  TraceSvgOptions options;
  options.max_depth = 1;
  absl::StatusOr<TraceLayout> layout = LayoutTrace(json{{"traceEvents", events}}.dump(), options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->spans_too_deep, 1);
  EXPECT_EQ(Box(*layout, "inner"), nullptr);
  EXPECT_EQ(Box(*layout, "middle")->depth, 1);
  EXPECT_EQ(Box(*layout, "next")->depth, 0);
  EXPECT_EQ(layout->tracks[0].depths, 2);
  EXPECT_THAT(RenderTraceSvg(*layout), HasSubstr("1 nested deeper than drawn"));
}

TEST(TraceSvgTest, SvgEscapesNamesAndHasOneRectPerBox) {
  json events = json::array();
  events.push_back(Meta("process_name", 0, 0, "rank <0> & co"));
  events.push_back(Span("aten::<lambda> & \"x\"", "cpu_op", 0, 1, 0, 1000, "0F0"));
  events.push_back(Span("0F0", "F", 0, 0, 0, 1000));
  TraceSvgOptions options;
  options.title = "a <title>";
  absl::StatusOr<std::string> svg = TraceToSvg(json{{"traceEvents", events}}.dump(), options);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(svg->rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_THAT(*svg, HasSubstr("</svg>"));
  EXPECT_THAT(*svg, HasSubstr("aten::&lt;lambda&gt; &amp; &quot;x&quot;"));
  EXPECT_THAT(*svg, HasSubstr("rank &lt;0&gt; &amp; co"));
  EXPECT_THAT(*svg, HasSubstr("a &lt;title&gt;"));
  EXPECT_THAT(*svg, HasSubstr("in 0F0"));  // the tooltip names the action
  EXPECT_EQ(svg->find("<lambda>"), std::string::npos);
  size_t titled = 0;
  for (size_t at = 0; (at = svg->find("</title></rect>", at)) != std::string::npos; ++at) ++titled;
  EXPECT_EQ(titled, 2u);
  EXPECT_THAT(*svg, HasSubstr("fill=\"#4c78a8\""));  // F's colour
}

TEST(TraceSvgTest, DrawsWhatMergeTracesWrites) {
  const double t0 = 7'000'000;
  const std::string actions = json{
      {"traceEvents",
       {{{"name", "0F0"},
         {"cat", "F"},
         {"ph", "X"},
         {"pid", 0},
         {"tid", 0},
         {"ts", 0},
         {"dur", 100}},
        {{"name", "0B0"},
         {"cat", "B"},
         {"ph", "X"},
         {"pid", 0},
         {"tid", 0},
         {"ts", 200},
         {"dur", 300}}}}}.dump();
  const std::string ops = json{{"traceEvents",
                                {{{"name", "aten::addmm"},
                                  {"cat", "cpu_op"},
                                  {"ph", "X"},
                                  {"pid", 0},
                                  {"tid", 9},
                                  {"ts", t0 + 10},
                                  {"dur", 50}},
                                 {{"name", "AddmmBackward0"},
                                  {"cat", "backward"},
                                  {"ph", "X"},
                                  {"pid", 0},
                                  {"tid", 9},
                                  {"ts", t0 + 250},
                                  {"dur", 100}}}},
                               {"otherData", {{"rank", 0}, {"clock", "steady_clock_us"}}}}
                              .dump();
  TraceMergeOptions merge;
  merge.action_time_offset_us = t0;
  absl::StatusOr<std::string> merged = MergeTraces({ops}, actions, merge);
  ASSERT_TRUE(merged.ok()) << merged.status();
  absl::StatusOr<TraceLayout> layout = LayoutTrace(*merged);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->tracks.size(), 2u);
  EXPECT_EQ(layout->tracks[0].lane_name, "rank 0");
  EXPECT_EQ(layout->tracks[0].track_name, "pipe actions");
  const TraceBox* f = Box(*layout, "0F0");
  const TraceBox* addmm = Box(*layout, "aten::addmm");
  const TraceBox* backward = Box(*layout, "AddmmBackward0");
  ASSERT_TRUE(f && addmm && backward);
  EXPECT_LT(f->y, addmm->y);
  EXPECT_GE(addmm->x, f->x);
  EXPECT_LE(addmm->x + addmm->width, f->x + f->width + 1e-9);
  EXPECT_EQ(addmm->pipe_action, "0F0");
  EXPECT_EQ(backward->pipe_action, "0B0");
}

TEST(TraceSvgTest, BadInputsAreNamed) {
  auto error = [](const std::string& text, const TraceSvgOptions& options = {}) {
    absl::StatusOr<TraceLayout> layout = LayoutTrace(text, options);
    EXPECT_FALSE(layout.ok()) << text;
    if (!layout.ok()) {
      EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
    }
    return layout.ok() ? std::string() : std::string(layout.status().message());
  };
  const std::string one = json{{"traceEvents", {Span("a", "cpu_op", 0, 1, 0, 10)}}}.dump();
  EXPECT_THAT(error("{not json"), HasSubstr("not JSON"));
  EXPECT_THAT(error("{\"x\": 1}"), HasSubstr("not a Chrome trace"));
  EXPECT_THAT(error("{\"traceEvents\": []}"), HasSubstr("no complete"));
  EXPECT_THAT(error(R"([{"ph": "X", "pid": "a", "tid": 1, "ts": 0, "dur": 1}])"),
              HasSubstr("pid and tid must be integers"));
  EXPECT_THAT(error(R"([{"ph": "X", "pid": 0, "tid": 1, "ts": "0", "dur": 1}])"),
              HasSubstr("numeric ts and dur"));
  // Events of other phases, or with no phase or a phase that is no string, are skipped.
  EXPECT_THAT(error(R"([{"ph": 1, "pid": 0, "ts": 0, "dur": 1}, {"ph": "B", "pid": 0, "ts": 0},
                       {"pid": 0, "ts": 0, "dur": 1}])"),
              HasSubstr("no complete"));
  TraceSvgOptions step;
  step.step = 9;
  const std::string with_steps = json{{"traceEvents",
                                       {Span("ProfilerStep#3", "step", 0, 1, 0, 10),
                                        Span("ProfilerStep#4", "step", 0, 1, 10, 10)}}}
                                     .dump();
  EXPECT_THAT(error(with_steps, step), HasSubstr("step 9 has no \"ProfilerStep#9\" span"));
  EXPECT_THAT(error(with_steps, step), HasSubstr("[3, 4]"));
  TraceSvgOptions inverted;
  inverted.start_us = 5;
  inverted.end_us = 5;
  EXPECT_THAT(error(one, inverted), HasSubstr("[5.000, 5.000] us is empty or inverted"));
  TraceSvgOptions empty;
  empty.start_us = 100;
  empty.end_us = 200;
  EXPECT_THAT(error(one, empty), HasSubstr("holds no complete event"));
  TraceSvgOptions narrow;
  narrow.width_px = 299;
  EXPECT_THAT(error(one, narrow), HasSubstr("width_px 299"));
  TraceSvgOptions depth;
  depth.max_depth = -1;
  EXPECT_THAT(error(one, depth), HasSubstr("max_depth -1"));
  TraceSvgOptions min_span;
  min_span.min_span_px = -0.5;
  EXPECT_THAT(error(one, min_span), HasSubstr("min_span_px -0.5"));
}

}  // namespace
}  // namespace pp
