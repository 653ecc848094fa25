#include "driver/run_report.h"

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"

namespace pp {
namespace {

namespace fs = std::filesystem;

// Two runs with the same name started in the same second shared one run
// directory: interleaved metrics.jsonl lines, one run's config.textproto
// (issue 29, finding 11). Runs racing to open their directories each get
// their own; the names start with <name>-<time>.
TEST(RunReportTest, RunsOfOneNameOpenedAtOnceGetDirectoriesOfTheirOwn) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path out = fs::path(tmp != nullptr ? tmp : "/tmp") / "run_report_same_name";
  fs::remove_all(out);
  ExperimentConfig config;
  config.set_name("same");
  config.set_output_dir(out.string());
  constexpr int kRuns = 8;
  std::vector<std::string> dirs(kRuns);
  std::vector<std::string> errors(kRuns);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRuns; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<RunReport> report = RunReport::Open(config, "gpt", /*rank0=*/true);
      if (report.ok()) {
        dirs[i] = report->dir().string();
      } else {
        errors[i] = report.status().ToString();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::set<std::string> distinct;
  for (int i = 0; i < kRuns; ++i) {
    EXPECT_EQ(errors[i], "");
    EXPECT_EQ(fs::path(dirs[i]).parent_path(), out);
    EXPECT_EQ(fs::path(dirs[i]).filename().string().rfind("same-", 0), 0u) << dirs[i];
    EXPECT_TRUE(fs::is_regular_file(fs::path(dirs[i]) / "config.textproto")) << dirs[i];
    distinct.insert(dirs[i]);
  }
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kRuns));
  // Rank 0 only: the other ranks create nothing.
  absl::StatusOr<RunReport> other = RunReport::Open(config, "gpt", /*rank0=*/false);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->active());
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), kRuns);
}

}  // namespace
}  // namespace pp
