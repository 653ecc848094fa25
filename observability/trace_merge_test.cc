#include "observability/trace_merge.h"

#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "observability/operator_profiler.h"

namespace pp {
namespace {

using nlohmann::json;

// An action as pipe's runtime times it.
struct Timed {
  int rank;
  std::string name;  // "0F0"
  double start_us;
  double end_us;
};

// pipe's action trace, in the format pipeline/schedule/ir/chrome_trace.h writes
// (a process "pipeline", one thread per rank, complete events with tid = rank,
// cat = the action type, args stage/microbatch), with timestamps relative to
// `t0` as Trainer::LastStepTrace writes them. Spelled out here because
// observability/ sits below pipeline/ and may not depend on it.
std::string PipeActionTrace(const std::vector<Timed>& actions, double t0) {
  json events = json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", 0},
                    {"args", {{"name", "pipeline 1f1b (measured)"}}}});
  std::set<int> ranks;
  for (const Timed& a : actions) ranks.insert(a.rank);
  for (int rank : ranks) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", rank},
                      {"args", {{"name", "rank " + std::to_string(rank)}}}});
  }
  for (const Timed& a : actions) {
    const std::string type = a.name.substr(1, a.name.size() - 2);  // "0F0" -> "F"
    events.push_back({{"name", a.name},
                      {"cat", type},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", a.rank},
                      {"ts", a.start_us - t0},
                      {"dur", a.end_us - a.start_us},
                      {"args", {{"stage", a.name[0] - '0'}, {"microbatch", 0}}}});
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump(1);
}

// An operator trace as OperatorProfiler writes it, from (name, tid, ts, dur).
std::string OperatorTrace(int rank,
                          const std::vector<std::tuple<std::string, int, double, double>>& ops) {
  json events = json::array();
  events.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", "x"}}}});
  for (const auto& [name, tid, ts, dur] : ops) {
    events.push_back({{"name", name},
                      {"cat", name.rfind("ProfilerStep#", 0) == 0 ? "step" : "cpu_op"},
                      {"ph", "X"},
                      {"pid", rank},
                      {"tid", tid},
                      {"ts", ts},
                      {"dur", dur}});
  }
  return json{{"traceEvents", events},
              {"otherData", {{"rank", rank}, {"clock", "steady_clock_us"}}}}
      .dump();
}

struct Merged {
  std::map<int, std::string> process_names;
  std::map<std::pair<int, int>, std::string> thread_names;
  std::map<std::pair<int, int>, int> thread_sort;
  std::vector<json> complete;
};

Merged Parse(const std::string& text) {
  Merged m;
  const json trace = json::parse(text);
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "M") {
      if (e["name"] == "process_name") m.process_names[e["pid"]] = e["args"]["name"];
      if (e["name"] == "thread_name") m.thread_names[{e["pid"], e["tid"]}] = e["args"]["name"];
      if (e["name"] == "thread_sort_index") {
        m.thread_sort[{e["pid"], e["tid"]}] = e["args"]["sort_index"];
      }
    } else if (e["ph"] == "X") {
      m.complete.push_back(e);
    }
  }
  return m;
}

const json* Find(const Merged& m, int pid, const std::string& name) {
  for (const json& e : m.complete) {
    if (e["pid"] == pid && e["name"] == name) return &e;
  }
  return nullptr;
}

TEST(TraceMergeTest, RanksAreLanesWithActionsAboveTheirOperators) {
  const double t0 = 5'000'000;
  const std::string actions = PipeActionTrace({{0, "0F0", t0 + 0, t0 + 100},
                                               {0, "0SEND_F0", t0 + 100, t0 + 110},
                                               {0, "0B0", t0 + 300, t0 + 500},
                                               {1, "1RECV_F0", t0 + 90, t0 + 120},
                                               {1, "1F0", t0 + 120, t0 + 200}},
                                              t0);
  const std::string rank0 = OperatorTrace(0, {{"ProfilerStep#4", 7, t0 - 5, 600},
                                              {"aten::addmm", 7, t0 + 10, 50},
                                              {"aten::mm", 7, t0 + 320, 40},
                                              {"aten::copy_", 9, t0 + 105, 2},
                                              {"aten::zeros", 7, t0 + 200, 5}});
  const std::string rank1 = OperatorTrace(1, {{"aten::relu", 3, t0 + 130, 20}});
  TraceMergeOptions options;
  options.action_time_offset_us = t0;
  auto merged = MergeTraces({rank1, rank0}, actions, options);
  ASSERT_TRUE(merged.ok()) << merged.status();
  const Merged m = Parse(*merged);

  EXPECT_EQ(m.process_names, (std::map<int, std::string>{{0, "rank 0"}, {1, "rank 1"}}));
  // The action track first, then one track per LibTorch thread.
  EXPECT_EQ(m.thread_names.at({0, 0}), "pipe actions");
  EXPECT_EQ(m.thread_sort.at({0, 0}), 0);
  EXPECT_EQ(m.thread_names.at({0, 1}), "operators (LibTorch thread 7)");
  EXPECT_EQ(m.thread_names.at({0, 2}), "operators (LibTorch thread 9)");
  EXPECT_GT(m.thread_sort.at({0, 1}), m.thread_sort.at({0, 0}));
  EXPECT_EQ(m.thread_names.at({1, 0}), "pipe actions");

  // Actions keep their name, category and args, moved onto the steady clock.
  const json* f = Find(m, 0, "0F0");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ((*f)["tid"], 0);
  EXPECT_EQ((*f)["cat"], "F");
  EXPECT_DOUBLE_EQ((*f)["ts"].get<double>(), t0);
  EXPECT_EQ((*f)["args"]["microbatch"], 0);
  ASSERT_NE(Find(m, 1, "1RECV_F0"), nullptr);
  EXPECT_EQ((*Find(m, 1, "1RECV_F0"))["tid"], 0);

  // Each operator names the action it ran in, on its own rank only.
  EXPECT_EQ((*Find(m, 0, "aten::addmm"))["args"]["pipe_action"], "0F0");
  EXPECT_EQ((*Find(m, 0, "aten::mm"))["args"]["pipe_action"], "0B0");
  EXPECT_EQ((*Find(m, 0, "aten::copy_"))["args"]["pipe_action"], "0SEND_F0");
  EXPECT_EQ((*Find(m, 0, "aten::copy_"))["tid"], 2);
  EXPECT_FALSE((*Find(m, 0, "aten::zeros")).contains("args"));  // between actions
  EXPECT_FALSE((*Find(m, 0, "ProfilerStep#4")).contains("args"));
  EXPECT_EQ((*Find(m, 1, "aten::relu"))["args"]["pipe_action"], "1F0");
  EXPECT_EQ((*Find(m, 1, "aten::relu"))["pid"], 1);
}

// A distributed optimizer's background reduce-scatter (pid 1 of the action
// trace, tid = rank) gets a track of its own under the rank's actions; the
// operators' tracks follow it.
TEST(TraceMergeTest, BackgroundCollectivesHaveTheirOwnTrack) {
  json actions = json::parse(PipeActionTrace({{0, "0F0", 0, 100}, {0, "0B0", 100, 300}}, 0));
  actions["traceEvents"].push_back({{"name", "gradient reduce-scatter, stage 0 bucket 0"},
                                    {"cat", "background"},
                                    {"ph", "X"},
                                    {"pid", 1},
                                    {"tid", 0},
                                    {"ts", 150},
                                    {"dur", 400}});
  auto merged = MergeTraces({OperatorTrace(0, {{"aten::mm", 7, 10, 50}})}, actions.dump());
  ASSERT_TRUE(merged.ok()) << merged.status();
  const Merged m = Parse(*merged);
  EXPECT_EQ(m.thread_names.at({0, 0}), "pipe actions");
  EXPECT_EQ(m.thread_names.at({0, 1}), "background collectives");
  EXPECT_EQ(m.thread_names.at({0, 2}), "operators (LibTorch thread 7)");
  const json* window = Find(m, 0, "gradient reduce-scatter, stage 0 bucket 0");
  ASSERT_NE(window, nullptr);
  EXPECT_EQ((*window)["tid"], 1);
  EXPECT_EQ((*Find(m, 0, "aten::mm"))["args"]["pipe_action"], "0F0");
  EXPECT_EQ(m.process_names.size(), 1u);  // no lane of its own
}

TEST(TraceMergeTest, OperatorsOnlyAndActionsOnly) {
  auto ops_only = MergeTraces({OperatorTrace(2, {{"aten::mm", 1, 10, 5}})}, "");
  ASSERT_TRUE(ops_only.ok()) << ops_only.status();
  EXPECT_EQ(Parse(*ops_only).process_names, (std::map<int, std::string>{{2, "rank 2"}}));
  auto actions_only = MergeTraces({}, PipeActionTrace({{1, "1F0", 0, 10}}, 0));
  ASSERT_TRUE(actions_only.ok()) << actions_only.status();
  EXPECT_NE(Find(Parse(*actions_only), 1, "1F0"), nullptr);
}

TEST(TraceMergeTest, RejectsBadInputsNamingThem) {
  const std::string ok_rank0 = OperatorTrace(0, {{"aten::mm", 1, 1000, 5}});
  auto not_json = MergeTraces({ok_rank0, "{oops"}, "");
  EXPECT_EQ(not_json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_json.status().message().find("operator trace #1"), std::string::npos)
      << not_json.status();

  auto no_events = MergeTraces({R"({"foo": 1})"}, "");
  EXPECT_NE(no_events.status().message().find("traceEvents"), std::string::npos);

  auto no_rank = MergeTraces({R"({"traceEvents": []})"}, "");
  EXPECT_NE(no_rank.status().message().find("otherData.rank"), std::string::npos);

  auto wrong_clock =
      MergeTraces({R"({"traceEvents": [], "otherData": {"rank": 0, "clock": "unix_us"}})"}, "");
  EXPECT_NE(wrong_clock.status().message().find("unix_us"), std::string::npos);

  auto twice = MergeTraces({ok_rank0, ok_rank0}, "");
  EXPECT_NE(twice.status().message().find("second operator trace of rank 0"), std::string::npos);

  auto string_tid = MergeTraces({R"({"traceEvents": [{"ph": "X", "ts": 1, "tid": "main"}],
           "otherData": {"rank": 0, "clock": "steady_clock_us"}})"},
                                "");
  EXPECT_EQ(string_tid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(string_tid.status().message().find("wrong type"), std::string::npos)
      << string_tid.status();

  auto bad_actions = MergeTraces({ok_rank0}, "[1, 2");
  EXPECT_NE(bad_actions.status().message().find("action trace"), std::string::npos);

  // Relative action times without the offset: nothing lines up.
  auto misaligned = MergeTraces({ok_rank0}, PipeActionTrace({{0, "0F0", 0, 10}}, 0));
  EXPECT_EQ(misaligned.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(misaligned.status().message().find("never overlap"), std::string::npos)
      << misaligned.status();
  EXPECT_NE(misaligned.status().message().find("rank 0"), std::string::npos);
}

TEST(TraceMergeTest, MergesFilesAndReportsMissingOnes) {
  const std::string dir = ::testing::TempDir();
  std::ofstream(dir + "/ops0.json") << OperatorTrace(0, {{"aten::mm", 1, 10, 5}});
  std::ofstream(dir + "/actions.json") << PipeActionTrace({{0, "0F0", 0, 20}}, 0);
  ASSERT_TRUE(
      MergeTraceFiles({dir + "/ops0.json"}, dir + "/actions.json", dir + "/merged.json").ok());
  std::ifstream in(dir + "/merged.json");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ((*Find(Parse(text.str()), 0, "aten::mm"))["args"]["pipe_action"], "0F0");

  absl::Status missing = MergeTraceFiles({dir + "/nope.json"}, "", dir + "/m.json");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("nope.json"), std::string::npos);
  EXPECT_EQ(MergeTraceFiles({dir + "/ops0.json"}, "", "/proc/no-such-dir/m.json").code(),
            absl::StatusCode::kInternal);
}

int64_t SteadyMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// End to end with LibTorch's real profiler: two ranks (threads) each run a
// forward "rF0" and a backward "rB0", timed like StageExecutor times actions;
// the merged trace puts each rank's matmul under its F and the matmul's
// autograd node under its B.
TEST(TraceMergeTest, RealProfilesLineUpUnderPipesActions) {
  std::vector<std::string> operator_traces(2);
  std::vector<Timed> actions;
  std::mutex actions_mutex;
  std::vector<absl::Status> status(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      auto profiler = OperatorProfiler::Create({{7, 7}, rank});
      if (!profiler.ok()) {
        status[rank] = profiler.status();
        return;
      }
      torch::nn::Linear layer(32, 32);
      status[rank] = (*profiler)->BeginStep(7);
      if (!status[rank].ok()) return;
      const std::string r = std::to_string(rank);
      const double f_start = SteadyMicros();
      torch::Tensor out = layer(torch::randn({16, 32})).tanh();
      const double f_end = SteadyMicros();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const double b_start = SteadyMicros();
      out.sum().backward();
      const double b_end = SteadyMicros();
      status[rank] = (*profiler)->EndStep(7);
      if (!status[rank].ok()) return;
      auto trace = (*profiler)->ChromeTraceJson();
      if (!trace.ok()) {
        status[rank] = trace.status();
        return;
      }
      operator_traces[rank] = *trace;
      std::lock_guard<std::mutex> lock(actions_mutex);
      actions.push_back({rank, r + "F0", f_start, f_end});
      actions.push_back({rank, r + "B0", b_start, b_end});
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int rank = 0; rank < 2; ++rank) ASSERT_TRUE(status[rank].ok()) << status[rank];

  double t0 = actions[0].start_us;
  for (const Timed& a : actions) t0 = std::min(t0, a.start_us);
  TraceMergeOptions options;
  options.action_time_offset_us = t0;
  auto merged = MergeTraces(operator_traces, PipeActionTrace(actions, t0), options);
  ASSERT_TRUE(merged.ok()) << merged.status();
  const Merged m = Parse(*merged);
  EXPECT_EQ(m.process_names.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r = std::to_string(rank);
    std::map<std::string, std::set<std::string>> ops_by_action;
    for (const json& e : m.complete) {
      if (e["pid"] != rank || e["tid"] == 0 || !e.contains("args")) continue;
      if (e["args"].contains("pipe_action")) {
        ops_by_action[e["args"]["pipe_action"]].insert(e["name"].get<std::string>());
      }
    }
    EXPECT_TRUE(ops_by_action[r + "F0"].count("aten::addmm"))
        << ::testing::PrintToString(ops_by_action[r + "F0"]);
    EXPECT_TRUE(ops_by_action[r + "F0"].count("aten::tanh"));
    EXPECT_TRUE(ops_by_action[r + "B0"].count("AddmmBackward0"))
        << ::testing::PrintToString(ops_by_action[r + "B0"]);
    EXPECT_FALSE(ops_by_action[r + "B0"].count("aten::tanh"));
    EXPECT_TRUE(ops_by_action[std::to_string(1 - rank) + "F0"].empty());
  }
}

}  // namespace
}  // namespace pp
