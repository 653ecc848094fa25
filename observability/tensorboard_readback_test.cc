// The real TensorBoard (the `tensorboard` package from the Python package
// index, via tensorboard_readback.py) reads an event file written here and
// finds every scalar's steps, values and wall times and every text. Skips, with
// the reason, when TensorBoard can be neither imported nor installed.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "observability/tensorboard_writer.h"

namespace pp {
namespace {

namespace fs = std::filesystem;

constexpr int kSkipExitCode = 77;

// A Python 3.9+ (what TensorBoard needs), "" if none.
std::string Python() {
  for (const char* candidate : {"python3", "/usr/bin/python3"}) {
    const std::string command = std::string(candidate) +
                                " -c 'import sys; sys.exit(sys.version_info < (3, 9))'"
                                " >/dev/null 2>&1";
    if (std::system(command.c_str()) == 0) return candidate;
  }
  return "";
}

// Runs `command`, returns its exit status and appends its stdout+stderr.
int Run(const std::string& command, std::string& output) {
  std::FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Writes the series a training run logs (issue 15) into `log_dir`, with values
// across float32's range, irregular steps and explicit wall times, and returns
// them in tensorboard_readback.py's expectation format.
nlohmann::json WriteRun(const std::string& log_dir) {
  nlohmann::json expected = {{"scalars", nlohmann::json::object()},
                             {"texts", nlohmann::json::object()}};
  auto writer = TensorBoardWriter::Create(log_dir);
  EXPECT_TRUE(writer.ok()) << writer.status();
  if (!writer.ok()) return expected;
  auto scalar = [&](const std::string& tag, int64_t step, double value, double wall_time) {
    EXPECT_TRUE((*writer)->AddScalar(tag, step, value, wall_time).ok());
    expected["scalars"][tag].push_back({step, value, wall_time});
  };
  const double t0 = 1.7e9;
  for (int64_t step = 1; step <= 40; ++step) {
    const double wall = t0 + 0.37 * step;
    scalar("train/loss", step, 5.6374 * std::exp(-0.03 * step), wall);
    scalar("train/lr", step, 3e-4 * std::min(1.0, step / 10.0), wall);
    scalar("train/grad_norm", step, 1.0 / std::sqrt(step), wall);
    scalar("train/tokens_per_s", step, 13500.0 + 7 * step, wall);
    scalar("train/step_time_s", step, 0.151 + 1e-4 * step, wall);
    for (int rank = 0; rank < 2; ++rank) {
      const std::string prefix = "rank_" + std::to_string(rank);
      scalar(prefix + "/bubble_fraction", step, 0.25 - 0.01 * rank, wall);
      scalar(prefix + "/peak_memory_bytes", step, 1.5e9 + 4096.0 * step * (rank + 1), wall);
    }
    if (step % 20 == 0) scalar("eval/loss", step, 2.4296 + 1.0 / step, wall);
  }
  const std::string sample =
      "This License as indion the the License\n\n    indented `code`\n**ünïcödé** \xe2\x86\x92 ok";
  EXPECT_TRUE((*writer)->AddText("sample", 40, sample, t0 + 20).ok());
  EXPECT_TRUE((*writer)->AddText("sample", 41, "second", t0 + 21).ok());
  expected["texts"]["sample"] = {{40, sample}, {41, "second"}};
  EXPECT_TRUE((*writer)->Close().ok());
  return expected;
}

// Runs tensorboard_readback.py on `log_dir` against `expected`; its exit status.
int ReadBack(const std::string& python, const std::string& log_dir, const nlohmann::json& expected,
             std::string& output) {
  const std::string expected_path = log_dir + ".expected.json";
  std::ofstream(expected_path) << expected.dump();
  return Run(python + " observability/tensorboard_readback.py " + log_dir + " " + expected_path,
             output);
}

class TensorBoardReadbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    python_ = Python();
    if (python_.empty()) GTEST_SKIP() << "no python3 (3.9 or newer) to run TensorBoard with";
    dir_ = ::testing::TempDir() + "/" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
  }
  std::string python_;
  std::string dir_;
};

TEST_F(TensorBoardReadbackTest, RealTensorBoardReadsEveryScalarAndText) {
  const nlohmann::json expected = WriteRun(dir_ + "/tb");
  std::string output;
  const int code = ReadBack(python_, dir_ + "/tb", expected, output);
  if (code == kSkipExitCode) GTEST_SKIP() << output;
  EXPECT_EQ(code, 0) << output;
  std::cout << output;
}

// The check has teeth: one value off by a float32 step, or a step missing, fails.
TEST_F(TensorBoardReadbackTest, RealTensorBoardCatchesAWrongValueOrAMissingStep) {
  const nlohmann::json expected = WriteRun(dir_ + "/tb");
  nlohmann::json wrong_value = expected;
  double& v = wrong_value["scalars"]["train/loss"][7][1].get_ref<double&>();
  v = std::nextafter(static_cast<float>(v), 10.0f);
  std::string output;
  int code = ReadBack(python_, dir_ + "/tb", wrong_value, output);
  if (code == kSkipExitCode) GTEST_SKIP() << output;
  EXPECT_EQ(code, 1) << output;
  EXPECT_NE(output.find("train/loss"), std::string::npos) << output;

  nlohmann::json missing_step = expected;
  missing_step["scalars"]["rank_1/peak_memory_bytes"].erase(3);
  output.clear();
  EXPECT_EQ(ReadBack(python_, dir_ + "/tb", missing_step, output), 1) << output;
  EXPECT_NE(output.find("rank_1/peak_memory_bytes"), std::string::npos) << output;

  nlohmann::json wrong_text = expected;
  wrong_text["texts"]["sample"][1][1] = "secund";
  output.clear();
  EXPECT_EQ(ReadBack(python_, dir_ + "/tb", wrong_text, output), 1) << output;
  EXPECT_NE(output.find("secund"), std::string::npos) << output;
}

}  // namespace
}  // namespace pp
