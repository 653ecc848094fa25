#include "observability/operator_profiler.h"

#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pp {
namespace {

int64_t SteadyMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::set<std::string> Names(const OperatorProfiler& p) {
  std::set<std::string> names;
  for (const OperatorEvent& e : p.events()) names.insert(e.name);
  return names;
}

// A step that leaves a recognizable mark: a user scope named after it around a
// forward and backward of a small linear layer.
void RunStep(int64_t step, torch::nn::Linear& layer) {
  RECORD_USER_SCOPE("step_body_" + std::to_string(step));
  torch::Tensor loss = layer(torch::randn({8, 16})).relu().sum();
  loss.backward();
}

TEST(ParseStepRangeTest, AcceptsRangesAndSingleSteps) {
  auto range = ParseStepRange("3:5");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->first, 3);
  EXPECT_EQ(range->last, 5);
  auto single = ParseStepRange("7");
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(single->first, 7);
  EXPECT_EQ(single->last, 7);
  EXPECT_TRUE(single->Contains(7));
  EXPECT_FALSE(range->Contains(6));
}

TEST(ParseStepRangeTest, NamesTheBadSpec) {
  for (const char* bad : {"", "a:b", "5:3", "-1:2", "1:2:3", "3:", ":4"}) {
    auto range = ParseStepRange(bad);
    EXPECT_EQ(range.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(range.status().message().find(absl::StrCat("\"", bad, "\"")), std::string::npos)
        << range.status();
    EXPECT_NE(range.status().message().find("N:M"), std::string::npos) << range.status();
  }
}

TEST(OperatorProfilerTest, RecordsOnlyTheRequestedSteps) {
  auto profiler = OperatorProfiler::Create({{1, 2}, /*rank=*/3});
  ASSERT_TRUE(profiler.ok()) << profiler.status();
  torch::nn::Linear layer(16, 4);
  for (int64_t step = 0; step < 5; ++step) {
    ASSERT_TRUE((*profiler)->BeginStep(step).ok());
    EXPECT_EQ((*profiler)->recording(), step == 1 || step == 2) << step;
    RunStep(step, layer);
    ASSERT_TRUE((*profiler)->EndStep(step).ok());
  }
  ASSERT_TRUE((*profiler)->finished());
  const std::set<std::string> names = Names(**profiler);
  EXPECT_TRUE(names.count("step_body_1"));
  EXPECT_TRUE(names.count("step_body_2"));
  EXPECT_FALSE(names.count("step_body_0"));
  EXPECT_FALSE(names.count("step_body_3"));
  // Forward operators and autograd's backward nodes.
  EXPECT_TRUE(names.count("aten::addmm")) << ::testing::PrintToString(names);
  EXPECT_TRUE(names.count("aten::relu"));
  bool backward = false;
  for (const OperatorEvent& e : (*profiler)->events()) {
    backward =
        backward || (e.category == "backward" && e.name.find("AddmmBackward") != std::string::npos);
  }
  EXPECT_TRUE(backward) << ::testing::PrintToString(names);
  ASSERT_EQ((*profiler)->steps().size(), 2u);
  EXPECT_EQ((*profiler)->steps()[0].step, 1);
  EXPECT_EQ((*profiler)->steps()[1].step, 2);
  EXPECT_LE((*profiler)->steps()[0].end_us, (*profiler)->steps()[1].start_us);
}

// A loop that jumps past the range's end (e.g. resumed) still stops the
// profile, before the step outside the range runs.
TEST(OperatorProfilerTest, StopsWhenTheLoopSkipsPastTheRange) {
  auto profiler = OperatorProfiler::Create({{1, 3}, 0});
  ASSERT_TRUE(profiler.ok()) << profiler.status();
  torch::nn::Linear layer(16, 4);
  for (int64_t step : {1, 5}) {
    ASSERT_TRUE((*profiler)->BeginStep(step).ok());
    EXPECT_EQ((*profiler)->finished(), step == 5);
    RunStep(step, layer);
    ASSERT_TRUE((*profiler)->EndStep(step).ok());
  }
  EXPECT_TRUE((*profiler)->finished());
  ASSERT_EQ((*profiler)->steps().size(), 1u);
  EXPECT_EQ((*profiler)->steps()[0].step, 1);
  EXPECT_TRUE(Names(**profiler).count("step_body_1"));
  EXPECT_FALSE(Names(**profiler).count("step_body_5"));
}

// Operator timestamps land on steady_clock: a scope recorded between two
// steady_clock reads is stamped between them.
TEST(OperatorProfilerTest, EventsAreOnTheSteadyClock) {
  auto profiler = OperatorProfiler::Create({{0, 0}, 0});
  ASSERT_TRUE(profiler.ok()) << profiler.status();
  ASSERT_TRUE((*profiler)->BeginStep(0).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int64_t before = SteadyMicros();
  {
    RECORD_USER_SCOPE("timed_scope");
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  const int64_t after = SteadyMicros();
  ASSERT_TRUE((*profiler)->EndStep(0).ok());
  const OperatorEvent* timed = nullptr;
  for (const OperatorEvent& e : (*profiler)->events()) {
    if (e.name == "timed_scope") timed = &e;
  }
  ASSERT_NE(timed, nullptr);
  EXPECT_EQ(timed->category, "user_annotation");
  constexpr int64_t kSlackUs = 200;  // anchor window + rounding, generous on a busy machine
  EXPECT_GE(timed->start_us, before - kSlackUs);
  EXPECT_LE(timed->start_us + timed->duration_us, after + kSlackUs);
  EXPECT_GE(timed->duration_us, 30000);
  EXPECT_GE(timed->start_us, (*profiler)->steps()[0].start_us + 20000 - kSlackUs);
}

TEST(OperatorProfilerTest, ChromeTraceParsesWithOperatorsStepsAndRank) {
  OperatorProfilerOptions options;
  options.steps = {0, 0};
  options.rank = 2;
  options.record_shapes = true;
  auto profiler = OperatorProfiler::Create(options);
  ASSERT_TRUE(profiler.ok()) << profiler.status();
  EXPECT_EQ((*profiler)->ChromeTraceJson().status().code(), absl::StatusCode::kFailedPrecondition);
  torch::nn::Linear layer(16, 4);
  ASSERT_TRUE((*profiler)->BeginStep(0).ok());
  RunStep(0, layer);
  ASSERT_TRUE((*profiler)->EndStep(0).ok());

  const std::string path = ::testing::TempDir() + "/profile_rank_2.json";
  ASSERT_TRUE((*profiler)->WriteChromeTrace(path).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json trace = nlohmann::json::parse(text.str());
  EXPECT_EQ(trace["otherData"]["rank"], 2);
  EXPECT_EQ(trace["otherData"]["clock"], "steady_clock_us");
  int operators = 0, steps = 0, with_shapes = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    EXPECT_EQ(e["pid"], 2);
    if (e["ph"] != "X") continue;
    if (e["cat"] == "step") {
      ++steps;
      EXPECT_EQ(e["name"], "ProfilerStep#0");
    } else {
      ++operators;
      if (e["name"] == "aten::addmm") {
        ++with_shapes;
        EXPECT_EQ(e["args"]["Input Dims"][1], nlohmann::json({8, 16})) << e.dump();
      }
    }
  }
  EXPECT_EQ(steps, 1);
  EXPECT_GT(operators, 5);
  EXPECT_GE(with_shapes, 1);

  EXPECT_EQ((*profiler)->WriteChromeTrace("/proc/no-such-dir/p.json").code(),
            absl::StatusCode::kInternal);
}

TEST(OperatorProfilerTest, RejectsMisuse) {
  EXPECT_EQ(OperatorProfiler::Create({{4, 2}, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OperatorProfiler::Create({{0, 1}, -1}).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto profiler = OperatorProfiler::Create({{0, 1}, 0});
  ASSERT_TRUE(profiler.ok());
  EXPECT_EQ((*profiler)->EndStep(0).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*profiler)->BeginStep(0).ok());
  EXPECT_EQ((*profiler)->BeginStep(1).code(), absl::StatusCode::kFailedPrecondition);
  absl::Status other_thread;
  std::thread([&] { other_thread = (*profiler)->EndStep(0); }).join();
  EXPECT_EQ(other_thread.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other_thread.message().find("thread"), std::string::npos) << other_thread;

  // A second profiler on a thread that is already profiled is refused with a
  // Status naming the profiler that holds the thread.
  auto second = OperatorProfiler::Create({{0, 0}, 5});
  ASSERT_TRUE(second.ok());
  absl::Status refused = (*second)->BeginStep(0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("already profiled (by the operator profiler of rank 0)"),
            std::string::npos)
      << refused;

  ASSERT_TRUE((*profiler)->EndStep(0).ok());
  // The run ends before the range's last step: keep what was recorded.
  ASSERT_TRUE((*profiler)->Stop().ok());
  EXPECT_TRUE((*profiler)->finished());
  EXPECT_TRUE((*profiler)->ChromeTraceJson().ok());
}

// Ranks run as threads (topology's thread harness) profile independently.
TEST(OperatorProfilerTest, ThreadsProfileTheirOwnOperators) {
  std::vector<std::set<std::string>> names(2);
  std::vector<absl::Status> status(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      auto profiler = OperatorProfiler::Create({{0, 2}, rank});
      if (!profiler.ok()) {
        status[rank] = profiler.status();
        return;
      }
      for (int64_t step = 0; step <= 2; ++step) {
        status[rank] = (*profiler)->BeginStep(step);
        if (!status[rank].ok()) return;
        {
          RECORD_USER_SCOPE("work_of_rank_" + std::to_string(rank));
          torch::Tensor x = torch::randn({32, 32});
          (void)x.matmul(x).sum().item<float>();
        }
        status[rank] = (*profiler)->EndStep(step);
        if (!status[rank].ok()) return;
      }
      names[rank] = Names(**profiler);
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(status[rank].ok()) << rank << ": " << status[rank];
    EXPECT_TRUE(names[rank].count("work_of_rank_" + std::to_string(rank))) << rank;
    EXPECT_FALSE(names[rank].count("work_of_rank_" + std::to_string(1 - rank))) << rank;
    EXPECT_TRUE(names[rank].count("aten::matmul")) << rank;
  }
}

// One process-wide recorder serves overlapping profilers: one recording
// shapes, one not, and a thread nobody profiles, all running operators at the
// same time. Each profile holds exactly its own thread's operators, the
// shapes only where asked, and a profiler dropped mid-step leaves the others
// recording.
TEST(OperatorProfilerTest, OverlappingProfilersShareTheProcessWideRecorder) {
  std::atomic<int> ready{0};
  std::atomic<bool> stop{false};
  auto wait_all = [&] {
    ready.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (ready.load() < 4 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  };
  std::thread unprofiled([&] {
    wait_all();
    while (!stop.load()) {
      RECORD_USER_SCOPE("unprofiled_work");
      torch::Tensor x = torch::randn({8, 8});
      (void)x.mm(x).sum().item<float>();
    }
  });
  std::thread dropped([&] {
    auto profiler = OperatorProfiler::Create({{0, 5}, 9});
    ASSERT_TRUE(profiler.ok());
    ASSERT_TRUE((*profiler)->BeginStep(0).ok());
    wait_all();
    { RECORD_USER_SCOPE("dropped_work"); }
    // Destroyed while recording.
  });
  std::vector<std::vector<OperatorEvent>> events(2);
  std::vector<absl::Status> status(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      OperatorProfilerOptions options;
      options.steps = {0, 3};
      options.rank = rank;
      options.record_shapes = rank == 0;
      auto profiler = OperatorProfiler::Create(options);
      ASSERT_TRUE(profiler.ok());
      wait_all();
      torch::nn::Linear layer(16, 4);
      for (int64_t step = 0; step <= 3 && status[rank].ok(); ++step) {
        status[rank] = (*profiler)->BeginStep(step);
        {
          RECORD_USER_SCOPE("rank_" + std::to_string(rank));
          layer(torch::randn({8, 16})).sum().backward();
        }
        if (status[rank].ok()) status[rank] = (*profiler)->EndStep(step);
      }
      events[rank] = (*profiler)->events();
    });
  }
  for (std::thread& t : ranks) t.join();
  dropped.join();
  stop = true;
  unprofiled.join();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(status[rank].ok()) << rank << ": " << status[rank];
    std::set<std::string> names;
    std::set<uint64_t> threads;
    int scopes = 0, addmm_with_shapes = 0, addmm = 0;
    for (const OperatorEvent& e : events[rank]) {
      names.insert(e.name);
      threads.insert(e.thread);
      scopes += e.name == "rank_" + std::to_string(rank);
      if (e.name == "aten::addmm") {
        ++addmm;
        addmm_with_shapes += !e.input_shapes.empty();
      }
    }
    EXPECT_EQ(scopes, 4) << rank;
    EXPECT_EQ(addmm, 4) << rank;
    EXPECT_EQ(addmm_with_shapes, rank == 0 ? 4 : 0) << rank;
    EXPECT_TRUE(names.count("AddmmBackward0")) << ::testing::PrintToString(names);
    EXPECT_FALSE(names.count("rank_" + std::to_string(1 - rank))) << rank;
    EXPECT_FALSE(names.count("unprofiled_work")) << rank;
    EXPECT_FALSE(names.count("dropped_work")) << rank;
    EXPECT_EQ(threads.size(), 1u) << rank;
  }
  // The recorder is free again: this thread can be profiled.
  auto after = OperatorProfiler::Create({{0, 0}, 0});
  ASSERT_TRUE(after.ok());
  ASSERT_TRUE((*after)->BeginStep(0).ok());
  { RECORD_USER_SCOPE("after"); }
  ASSERT_TRUE((*after)->EndStep(0).ok());
  EXPECT_TRUE(Names(**after).count("after"));
}

}  // namespace
}  // namespace pp
