// pipe's schedule CSV files against the real PyTorch 2.15 (the newest on the
// Python package index, tools/python_envs/torch-newest.txt), both ways:
//  - pipe -> PyTorch: every registered training schedule's compute + comms
//    form (ProgramToCsv) loads in PyTorch's _PipelineScheduleRuntime
//    (_load_csv "compute_comms": WAIT_SEND_* and REDUCE_GRAD/WAIT_REDUCE_GRAD
//    pairs as its loader requires);
//  - PyTorch -> pipe: PyTorch lowers pipe's compute-only form and dumps its
//    compute + comms form (UNSHARD/RESHARD, waits); pipe reads it without a
//    placement (inferred from the cells) and gets the same schedule;
//  - ScheduleInterleaved1F1B's orders, m < p included, equal interleaved_1f1b's.
// The venv comes from tools/python_env.sh (made once per machine; the test
// fails naming the script when it cannot be made). Forward-only schedules
// are not loaded: PyTorch's runtime requires a backward for every stage.
#include <pwd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/formats/csv.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

std::string RunCommand(const std::string& command, int* status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return out;
  }
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  *status = pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string WithoutPlacementLine(const std::string& csv) {
  // PyTorch's reader knows no comments; it infers the placement itself.
  if (csv.rfind("#", 0) == 0) return csv.substr(csv.find('\n') + 1);
  return csv;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream file(path);
  file << text;
  ASSERT_TRUE(file.good()) << path;
}

std::string Read(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

class PyTorchInteropTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Bazel points HOME at the test's temporary directory: the venv lives
    // under the real home (made once per machine, shared with CI).
    const passwd* user = getpwuid(getuid());
    const std::string home = user != nullptr ? user->pw_dir : "";
    const std::string log = ::testing::TempDir() + "/python_env.log";
    int status = 0;
    const std::string venv = RunCommand(
        absl::StrCat("HOME='", home, "' tools/python_env.sh torch-newest 2>'", log, "'"), &status);
    if (status != 0 || venv.empty()) {
      python_ = "";
      setup_error_ = Read(log);
      return;
    }
    python_ = venv + "/bin/python";
  }
  static std::string setup_error_;
  static std::string python_;
};
std::string PyTorchInteropTest::python_;
std::string PyTorchInteropTest::setup_error_;

TEST_F(PyTorchInteropTest, CsvFilesGoBothWaysAndInterleavedOrdersMatch) {
  ASSERT_FALSE(python_.empty())
      << "no PyTorch venv: run tools/python_env.sh torch-newest (it installs "
         "tools/python_envs/torch-newest.txt into ~/.cache/pipe-python once; needs the network): "
      << setup_error_;
  const std::string dir = ::testing::TempDir();
  int files = 0, interleaved_compared = 0;
  for (int p : {2, 3, 4}) {
    struct Case {
      std::string name;
      Schedule schedule;
      std::string dump;
    };
    std::vector<Case> cases;
    nlohmann::json manifest = {
        {"p", p}, {"cases", nlohmann::json::array()}, {"interleaved", nlohmann::json::array()}};
    for (const std::string& name : RegisteredScheduleNames()) {
      for (int m : {1, 2, 3, 4, 6, 8}) {
        for (int v : {1, 2}) {
          absl::StatusOr<Schedule> s = MakeSchedule(name, {p, m, v, 0});
          if (!s.ok() || s->forward_only) continue;
          absl::StatusOr<LoweredProgram> program = Lower(*s);
          ASSERT_TRUE(program.ok()) << program.status();
          const std::string base = absl::StrCat(dir, "/", name, "_p", p, "_m", m, "_v", v);
          Write(base + "_compute.csv", WithoutPlacementLine(ScheduleToCsv(*s)));
          Write(base + "_comms.csv", WithoutPlacementLine(ProgramToCsv(*program)));
          manifest["cases"].push_back({{"compute", base + "_compute.csv"},
                                       {"comms", base + "_comms.csv"},
                                       {"dump", base + "_pytorch_comms.csv"},
                                       {"m", m}});
          cases.push_back(
              {absl::StrCat(name, " p=", p, " m=", m, " v=", v), *s, base + "_pytorch_comms.csv"});
        }
      }
    }
    std::vector<std::pair<int, int>> interleaved;  // (m, v)
    for (int m : {1, 2, 3, p, 2 * p}) {
      for (int v : {2, 3}) {
        interleaved.push_back({m, v});
        manifest["interleaved"].push_back(
            {{"m", m},
             {"v", v},
             {"out", absl::StrCat(dir, "/pt_interleaved_p", p, "_m", m, "_v", v, ".csv")}});
      }
    }
    const std::string manifest_path = absl::StrCat(dir, "/manifest_p", p, ".json");
    const std::string results_path = absl::StrCat(dir, "/results_p", p, ".json");
    Write(manifest_path, manifest.dump());
    int status = 0;
    const std::string output =
        RunCommand(absl::StrCat(python_, " pipeline/schedule/schedules/pytorch_csv_check.py ",
                                manifest_path, " ", results_path, " 2>&1"),
                   &status);
    ASSERT_EQ(status, 0) << output;
    nlohmann::json results = nlohmann::json::parse(Read(results_path));
    EXPECT_EQ(results["torch"].get<std::string>().rfind("2.15.", 0), 0u) << results["torch"];
    ASSERT_EQ(results["cases"].size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE(cases[i].name);
      const nlohmann::json& r = results["cases"][i];
      EXPECT_TRUE(r["comms"].is_null()) << "PyTorch refused pipe's csv_comms: " << r["comms"];
      ASSERT_TRUE(r["compute"].is_null()) << "PyTorch refused pipe's csv: " << r["compute"];
      // PyTorch's lowering read back by pipe, placement inferred.
      absl::StatusOr<Schedule> back = LoadCsvScheduleFile(cases[i].dump);
      ASSERT_TRUE(back.ok()) << back.status() << "\n" << Read(cases[i].dump);
      EXPECT_EQ(back->ranks, cases[i].schedule.ranks);
      EXPECT_EQ(back->stage_to_rank, cases[i].schedule.stage_to_rank);
      ++files;
    }
    for (size_t i = 0; i < interleaved.size(); ++i) {
      const auto [m, v] = interleaved[i];
      SCOPED_TRACE(absl::StrCat("interleaved_1f1b p=", p, " m=", m, " v=", v));
      const nlohmann::json& error = results["interleaved"][i];
      absl::StatusOr<Schedule> ours = MakeSchedule("interleaved_1f1b", {p, m, v, 0});
      if (!error.is_null()) {
        // PyTorch refuses it (m not a multiple of its rounds): so may pipe.
        continue;
      }
      if (!ours.ok() && m >= p) {
        // m >= p: pipe keeps Megatron's group rule (PyTorch runs e.g. p = 2,
        // m = 3 as one round of 3; Megatron refuses m % p = 1 < p).
        continue;
      }
      ASSERT_TRUE(ours.ok()) << "PyTorch runs it, pipe refuses: " << ours.status();
      absl::StatusOr<Schedule> theirs =
          LoadCsvScheduleFile(manifest["interleaved"][i]["out"].get<std::string>());
      ASSERT_TRUE(theirs.ok()) << theirs.status();
      EXPECT_EQ(theirs->ranks, ours->ranks);
      ++interleaved_compared;
    }
  }
  EXPECT_GT(files, 150);
  EXPECT_GE(interleaved_compared, 12);
}

}  // namespace
}  // namespace pp
