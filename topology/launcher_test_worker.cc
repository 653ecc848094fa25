// Test helper for launcher_test: an "experiment" whose workers behave as told
// (succeed after a real rendezvous, fail, die by a signal, hang).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "topology/launcher.h"
#include "topology/launcher_status.h"
#include "topology/rendezvous.h"

ABSL_FLAG(std::string, mode, "ok", "ok | fail | signal | hang");
ABSL_FLAG(int, fail_after_ms, 0,
          "Mode fail: the failing rank waits this long after every rank started (a peer that "
          "times out waiting for a stopped one).");
ABSL_FLAG(int, fail_rank, 0, "The rank that fails in modes fail/signal.");
ABSL_FLAG(int, exit_code, 3, "Exit status of the failing rank in mode fail.");
ABSL_FLAG(std::string, pid_dir, "", "Each worker writes its pid to <dir>/<rank>.pid.");
ABSL_FLAG(bool, ignore_sigterm, false, "Workers that do not fail ignore SIGTERM.");
ABSL_FLAG(int, default_nproc, 0,
          "If > 0: the experiment's world size (--nproc_per_node's default).");
ABSL_FLAG(bool, report_status, false,
          "Workers report a grid place (2 stages: stage = rank / 2, data-parallel index = rank "
          "% 2) and two actions to the launcher (topology/launcher_status.h), as ParallelGrid "
          "and StageExecutor do.");
ABSL_FLAG(int, fail_until_restart, -1,
          "Modes fail/signal: the failing rank fails only in attempts before this restart count "
          "(TORCHELASTIC_RESTART_COUNT), then every rank runs as in mode ok; -1: always.");
ABSL_FLAG(int, report_step, -1,
          "If >= 0: every worker reports this training step plus --step_per_restart times its "
          "restart count to the launcher (what the launcher calls progress).");
ABSL_FLAG(int, step_per_restart, 0, "See --report_step.");
ABSL_FLAG(bool, refuse_config, false,
          "The experiment's launcher-side check refuses the run (exit 2, before any worker).");

namespace {

void SleepForever() {
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Waits (up to 10 s) until every rank has written its pid file, so that a
// failure happens while the siblings are certainly running.
void WaitForPidFiles(const std::string& dir, int world_size) {
  for (int i = 0; i < 200; ++i) {
    bool all = true;
    for (int r = 0; r < world_size; ++r) {
      all = all && std::ifstream(absl::StrCat(dir, "/", r, ".pid")).good();
    }
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

int main(int argc, char** argv) {
  pp::MaybeLaunch(argc, argv, [] {
    if (absl::GetFlag(FLAGS_refuse_config)) {
      std::fprintf(stderr, "error: the experiment refused its config\n");
      std::exit(2);
    }
    return absl::GetFlag(FLAGS_default_nproc);  // 0: no experiment default
  });
  auto env = pp::DistEnvFromEnvironment();
  if (!env.ok()) {
    std::fprintf(stderr, "bad env: %s\n", env.status().ToString().c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_report_status)) {
    const int stage = env->rank / 2;
    pp::ReportWorkerPlace(stage, env->rank % 2);
    pp::ReportWorkerAction(absl::StrCat("train step 7 ", stage, "F3"));
    pp::ReportWorkerAction(absl::StrCat("train step 7 ", stage, "B3"));
  }
  const pp::WorkerRestart restart = pp::WorkerRestartFromEnv();
  if (absl::GetFlag(FLAGS_report_step) >= 0) {
    pp::ReportWorkerStep(absl::GetFlag(FLAGS_report_step) +
                         int64_t{absl::GetFlag(FLAGS_step_per_restart)} * restart.count);
  }
  if (env->rank == 0) {
    std::printf("attempt %d of at most %d; cause: %s\n", restart.count, restart.max_restarts + 1,
                restart.cause.empty() ? "none" : restart.cause.c_str());
    std::fflush(stdout);
  }
  const std::string pid_dir = absl::GetFlag(FLAGS_pid_dir);
  if (!pid_dir.empty()) {
    const std::string path = absl::StrCat(pid_dir, "/", env->rank, ".pid");
    std::ofstream(path + ".tmp") << getpid() << "\n";
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
  const int fail_until = absl::GetFlag(FLAGS_fail_until_restart);
  const std::string mode =
      fail_until >= 0 && restart.count >= fail_until ? "ok" : absl::GetFlag(FLAGS_mode);
  std::printf("hello from rank %d of %d local %d/%d omp=%s threads=%d\n", env->rank,
              env->world_size, env->local_rank, env->local_world_size,
              std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "unset",
              at::get_num_threads());
  const char* mmap_threshold = std::getenv("MALLOC_MMAP_THRESHOLD_");
  const char* trim_threshold = std::getenv("MALLOC_TRIM_THRESHOLD_");
  std::printf("malloc mmap_threshold=%s trim_threshold=%s\n",
              mmap_threshold ? mmap_threshold : "unset", trim_threshold ? trim_threshold : "unset");
  std::fflush(stdout);
  if (mode == "ok") {
    pp::RendezvousOptions options;
    options.timeout = std::chrono::seconds(20);
    auto world = pp::RendezvousFromEnv(options);
    if (!world.ok()) {
      std::fprintf(stderr, "rendezvous: %s\n", world.status().ToString().c_str());
      return 1;
    }
    std::vector<at::Tensor> t = {at::full({1}, env->rank, at::kLong)};
    world->group->allreduce(t)->wait();
    std::printf("sum=%lld\n", static_cast<long long>(t[0].item<int64_t>()));
    std::fprintf(stderr, "to stderr");  // no newline: the launcher still prefixes it
    world->group->barrier()->wait();
    return 0;
  }
  const bool failing =
      (mode == "fail" || mode == "signal") && env->rank == absl::GetFlag(FLAGS_fail_rank);
  if (failing) {
    if (!pid_dir.empty()) {
      WaitForPidFiles(pid_dir, env->world_size);
      // CLOCK_MONOTONIC is system-wide: the test compares it with the
      // moment the launcher exits.
      std::ofstream(absl::StrCat(pid_dir, "/failed_at"))
          << std::chrono::steady_clock::now().time_since_epoch().count() << "\n";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(absl::GetFlag(FLAGS_fail_after_ms)));
    if (mode == "signal") raise(SIGKILL);
    return absl::GetFlag(FLAGS_exit_code);
  }
  if (absl::GetFlag(FLAGS_ignore_sigterm)) signal(SIGTERM, SIG_IGN);
  SleepForever();
}
