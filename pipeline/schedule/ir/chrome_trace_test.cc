#include "pipeline/schedule/ir/chrome_trace.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pp {
namespace {

TEST(ChromeTraceTest, OneCompleteEventPerActionWithRankThreads) {
  std::vector<TraceEvent> events = {
      {0, "0F0", 0, 1}, {1, "1F0", 1, 2}, {1, "1RECV_F0", 1, 1}, {0, "loss", 2, 2.5}};
  ChromeTraceOptions options;
  options.microseconds_per_unit = 1000;
  nlohmann::json trace = nlohmann::json::parse(ChromeTraceJson(events, options));
  int complete = 0, thread_names = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      if (e["name"] == "1F0") {
        EXPECT_EQ(e["tid"], 1);
        EXPECT_EQ(e["cat"], "F");
        EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 1000);
        EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 1000);
        EXPECT_EQ(e["args"]["microbatch"], 0);
        EXPECT_EQ(e["args"]["stage"], 1);
      }
      if (e["name"] == "1RECV_F0") {
        EXPECT_EQ(e["cat"], "RECV_F");
      }
      if (e["name"] == "loss") {
        EXPECT_EQ(e["cat"], "other");
      }
    } else if (e["name"] == "thread_name") {
      ++thread_names;
    }
  }
  EXPECT_EQ(complete, 4);
  EXPECT_EQ(thread_names, 2);
}

// Background work (an early reduce-scatter) goes to process 1, "background
// collectives", one thread per rank; the actions stay in process 0.
TEST(ChromeTraceTest, BackgroundEventsHaveAProcessOfTheirOwn) {
  TraceEvent window{1, "gradient reduce-scatter, stage 1 bucket 0", 0.5, 3};
  window.background = true;
  nlohmann::json trace =
      nlohmann::json::parse(ChromeTraceJson({{1, "1B0", 0, 1}, window}, ChromeTraceOptions{}));
  std::map<int, std::string> process_names;
  for (const auto& e : trace["traceEvents"]) {
    if (e["name"] == "process_name") process_names[e["pid"]] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    const bool background = e["name"] == window.name;
    EXPECT_EQ(e["pid"], background ? 1 : 0) << e;
    EXPECT_EQ(e["tid"], 1) << e;
    EXPECT_EQ(e["cat"], background ? "background" : "B") << e;
  }
  EXPECT_EQ(process_names.at(1), "background collectives");
  EXPECT_EQ(process_names.size(), 2u);
}

// An asynchronous collective's span in flight names the action that started
// it, with that action's stage and micro-batch.
TEST(ChromeTraceTest, ACollectiveInFlightNamesItsStarter) {
  const TraceEvent flight = InFlightEvent(0, "OUT_STATS3", 2, 5);
  EXPECT_EQ(flight.name, "OUT_STATS3 in flight");
  nlohmann::json trace = nlohmann::json::parse(
      ChromeTraceJson({{0, "OUT_STATS3", 2, 2.1}, flight}, ChromeTraceOptions{}));
  int seen = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["pid"] != 1) continue;
    ++seen;
    EXPECT_EQ(e["cat"], "background") << e;
    EXPECT_EQ(e["args"]["started_by"], "OUT_STATS3") << e;
    EXPECT_EQ(e["args"]["microbatch"], 3) << e;
    EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 3000) << e;
  }
  EXPECT_EQ(seen, 1);
}

TEST(ChromeTraceTest, WritesAFileAndReportsUnwritablePaths) {
  const std::string path = ::testing::TempDir() + "/trace.json";
  ASSERT_TRUE(WriteChromeTrace(path, {{0, "0F0", 0, 1}}).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_TRUE(nlohmann::json::parse(text.str()).contains("traceEvents"));
  EXPECT_EQ(WriteChromeTrace("/nonexistent-dir/x/trace.json", {}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pp
