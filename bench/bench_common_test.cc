#include "bench/bench_common.h"

#include <chrono>
#include <thread>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "absl/flags/flag.h"

namespace pp {
namespace {

TEST(BenchCommonTest, Statistics) {
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 3);  // upper median
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Min({3, -1, 2}), -1);
  EXPECT_EQ(Min({}), 0);
  EXPECT_EQ(Mean({1, 2, 6}), 3);
  EXPECT_EQ(Mean({}), 0);
  const BenchClock::time_point t0{};
  EXPECT_DOUBLE_EQ(Seconds(t0, t0 + std::chrono::milliseconds(1500)), 1.5);
}

TEST(BenchCommonTest, ThreadsFlagWinsOverTheDefault) {
  EXPECT_EQ(SetBenchThreads(1), 1);
  absl::SetFlag(&FLAGS_threads, 2);
  EXPECT_EQ(SetBenchThreads(1), 2);
  absl::SetFlag(&FLAGS_threads, 0);
}

TEST(BenchCommonTest, ThreadCpuSecondsCountsNoSleep) {
  const double before = ThreadCpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double after = ThreadCpuSeconds();
  EXPECT_GE(after, before);
  EXPECT_LT(after - before, 0.05);  // a sleeping thread uses (almost) no CPU
}

TEST(BenchCommonTest, ExitCode) {
  EXPECT_EQ(ExitCode("bench", absl::OkStatus()), 0);
  EXPECT_EQ(ExitCode("bench", absl::InternalError("boom")), 1);
}

}  // namespace
}  // namespace pp
