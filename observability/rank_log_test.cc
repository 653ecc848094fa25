#include "observability/rank_log.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <glog/logging.h>
#include <gtest/gtest.h>

namespace pp {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return (std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / name).string();
}

class RankLogTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { google::InitGoogleLogging("rank_log_test"); }
  void TearDown() override {
    StopRankLogging();
    SetLogVerbosity(0);
  }
};

TEST_F(RankLogTest, EveryMessageInTheFileWithTheLabelOnlyWarningsOnTheConsole) {
  StartRankLogging();
  LOG(INFO) << "held before the file opens";
  VLOG(1) << "not at v=0";
  const std::string path = TempPath("logs/rank_3.log");
  ASSERT_TRUE(OpenRankLog(path, "rank=3 stage=1 data=1").ok());
  EXPECT_EQ(RankLogPath(), path);
  testing::internal::CaptureStderr();
  LOG(INFO) << "info after open";
  LOG(WARNING) << "a warning";
  SetLogVerbosity(1);
  VLOG(1) << "verbose one";
  VLOG(2) << "verbose two";
  std::thread([] { LOG(INFO) << "from another thread"; }).join();
  const std::string console = testing::internal::GetCapturedStderr();
  StopRankLogging();
  EXPECT_EQ(RankLogPath(), "");

  EXPECT_EQ(console.find("info after open"), std::string::npos) << console;
  EXPECT_EQ(console.find("verbose one"), std::string::npos) << console;
  EXPECT_NE(console.find("a warning"), std::string::npos) << console;

  std::istringstream lines(Slurp(path));
  std::string line;
  std::vector<std::string> all;
  while (std::getline(lines, line)) all.push_back(line);
  ASSERT_EQ(all.size(), 5u) << Slurp(path);
  const char* want[] = {"held before the file opens", "info after open", "a warning", "verbose one",
                        "from another thread"};
  const char want_severity[] = {'I', 'I', 'W', 'I', 'I'};
  for (size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(all[i]);
    EXPECT_EQ(all[i][0], want_severity[i]);
    EXPECT_NE(all[i].find(" rank=3 stage=1 data=1 rank_log_test.cc:"), std::string::npos);
    EXPECT_NE(all[i].find(std::string("] ") + want[i]), std::string::npos);
  }
}

TEST_F(RankLogTest, HeldMessagesBeyondTheLimitAreCountedNotKept) {
  StartRankLogging({.stderr_threshold = 2, .max_held = 2});
  for (int i = 0; i < 5; ++i) LOG(INFO) << "held " << i;
  const std::string path = TempPath("rank_held.log");
  ASSERT_TRUE(OpenRankLog(path, "rank=0").ok());
  StopRankLogging();
  const std::string text = Slurp(path);
  EXPECT_NE(text.find("(3 earlier messages were dropped"), std::string::npos) << text;
  EXPECT_EQ(text.find("held 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("] held 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("] held 4\n"), std::string::npos) << text;
}

TEST_F(RankLogTest, AnErrorForTheFileOnly) {
  StartRankLogging();
  const std::string path = TempPath("rank_error.log");
  ASSERT_TRUE(OpenRankLog(path, "rank=2").ok());
  testing::internal::CaptureStderr();
  LogErrorToRankLogOnly("step 3: receive timed out");
  LOG(ERROR) << "a normal error";
  const std::string console = testing::internal::GetCapturedStderr();
  StopRankLogging();
  EXPECT_EQ(console.find("receive timed out"), std::string::npos) << console;
  EXPECT_NE(console.find("a normal error"), std::string::npos) << console;
  const std::string text = Slurp(path);
  EXPECT_EQ(text[0], 'E') << text;
  EXPECT_NE(text.find(" rank=2 rank_log_test.cc:"), std::string::npos) << text;
  EXPECT_NE(text.find("] step 3: receive timed out\n"), std::string::npos) << text;
}

TEST_F(RankLogTest, Misuse) {
  const absl::Status before = OpenRankLog(TempPath("x.log"), "rank=0");
  EXPECT_EQ(before.code(), absl::StatusCode::kFailedPrecondition) << before;
  StartRankLogging();
  const absl::Status bad = OpenRankLog("/proc/no/such/dir/rank_0.log", "rank=0");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInternal) << bad;
  EXPECT_NE(bad.message().find("/proc/no/such/dir/rank_0.log"), std::string::npos) << bad;
  ASSERT_TRUE(OpenRankLog(TempPath("y.log"), "rank=0").ok());
  const absl::Status twice = OpenRankLog(TempPath("z.log"), "rank=0");
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition) << twice;
  EXPECT_NE(twice.message().find("y.log is already open"), std::string::npos) << twice;
}

}  // namespace
}  // namespace pp
