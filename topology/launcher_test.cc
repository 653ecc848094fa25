// Runs launcher_test_worker (an experiment binary carrying the launcher) as a
// real child process and checks what the launcher does with its workers.
#include "topology/launcher.h"
#include "topology/restart_rounds.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/torch_compat_blas.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "topology/blas_kernel.h"
#include "topology/rendezvous.h"

namespace pp {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

std::string WorkerBinary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr && workspace != nullptr) {
    return absl::StrCat(srcdir, "/", workspace, "/topology/launcher_test_worker");
  }
  return "topology/launcher_test_worker";
}

struct Result {
  int wait_status = -1;
  bool timed_out = false;
  double seconds = 0;
  Clock::time_point exited_at;
  std::string out, err;
};

// Starts the worker binary with `args` (the environment minus RANK and thread
// settings), collects stdout/stderr, and kills it after `timeout`. `on_start`
// runs once with the launcher's pid (e.g. to send it SIGINT).
Result RunLauncher(const std::vector<std::string>& args, double timeout_s = 60,
                   const std::function<void(pid_t)>& on_start = nullptr,
                   const std::vector<std::pair<std::string, std::string>>& env = {}) {
  std::vector<std::string> argv = {WorkerBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  int out_pipe[2], err_pipe[2];
  EXPECT_EQ(pipe2(out_pipe, O_CLOEXEC), 0);
  EXPECT_EQ(pipe2(err_pipe, O_CLOEXEC), 0);
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    for (const char* name :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
          "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "PP_INTRA_OP_THREADS",
          "PP_BLAS_THREADS", "PP_REPORT_THREADS", "MALLOC_MMAP_THRESHOLD_",
          "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "OPENBLAS_CORETYPE"}) {
      unsetenv(name);
    }
    for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
    execv(c_argv[0], c_argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  Result result;
  if (on_start) on_start(pid);
  int fds_open = 2;
  std::string* sinks[2] = {&result.out, &result.err};
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  bool exited = false;
  while (!exited || fds_open > 0) {
    poll(fds, 2, 50);
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[4096];
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --fds_open;
      } else {
        sinks[i]->append(buffer, n);
      }
    }
    if (!exited && waitpid(pid, &result.wait_status, WNOHANG) == pid) {
      exited = true;
      result.exited_at = Clock::now();
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (!exited && elapsed > timeout_s) {
      result.timed_out = true;
      kill(pid, SIGKILL);
    }
    if (exited && elapsed > timeout_s + 5) break;  // a leaked worker holds the pipe
  }
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

int ExitCode(const Result& r) { return WIFEXITED(r.wait_status) ? WEXITSTATUS(r.wait_status) : -1; }

std::string NewDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/", name, "_", getpid());
  mkdir(dir.c_str(), 0755);
  return dir;
}

pid_t ReadPid(const std::string& dir, int rank) {
  pid_t pid = -1;
  std::ifstream(absl::StrCat(dir, "/", rank, ".pid")) >> pid;
  return pid;
}

// SIGSTOPs worker `rank` once its pid file appears (at most 30 s). Without a
// pid it fails the test instead: kill(-1, SIGSTOP) would stop every process
// this test may signal.
void StopWorker(const std::string& dir, int rank) {
  for (int i = 0; i < 1200 && ReadPid(dir, rank) <= 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  const pid_t pid = ReadPid(dir, rank);
  if (pid <= 0) {
    ADD_FAILURE() << "rank " << rank << " wrote no pid file in 30 s; not stopping anything";
    return;
  }
  kill(pid, SIGSTOP);
}

// Seconds from the failing worker's exit to the launcher's.
double SecondsFromFailureToExit(const std::string& dir, const Result& r) {
  Clock::rep failed_at = 0;
  std::ifstream(absl::StrCat(dir, "/failed_at")) >> failed_at;
  EXPECT_GT(failed_at, 0) << "the failing worker did not record its exit";
  const double seconds =
      std::chrono::duration<double>(r.exited_at - Clock::time_point(Clock::duration(failed_at)))
          .count();
  EXPECT_GT(seconds, 0.0);
  return seconds;
}

bool Alive(pid_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH); }

TEST(LauncherTest, NormalExitReturnsZeroAndPrefixesLines) {
  Result r = RunLauncher({"--nproc_per_node=3", "--mode=ok"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(ExitCode(r), 0) << r.out << r.err;
  const int threads = DefaultWorkerThreads(3).intra_op;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THAT(r.out,
                HasSubstr(absl::StrCat("[rank ", rank, "] hello from rank ", rank, " of 3 local ",
                                       rank, "/3 omp=", threads, " threads=", threads, "\n")));
    // Every rank saw the same all-reduce: 0 + 1 + 2.
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("[rank ", rank, "] sum=3\n")));
    // stderr is forwarded to stderr, and a last line without '\n' is kept.
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("[rank ", rank, "] to stderr\n")));
  }
  // Every line of stdout carries a prefix.
  size_t start = 0;
  for (size_t nl; (nl = r.out.find('\n', start)) != std::string::npos; start = nl + 1) {
    EXPECT_EQ(r.out.compare(start, 6, "[rank "), 0) << r.out.substr(start, nl - start);
  }
}

TEST(LauncherTest, FailingWorkerStopsItsSiblings) {
  const std::string dir = NewDir("fail");
  Result r = RunLauncher({"--nproc_per_node=3", "--mode=fail", "--fail_rank=1", "--exit_code=3",
                          absl::StrCat("--pid_dir=", dir)});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(ExitCode(r), 0);
  EXPECT_EQ(ExitCode(r), 3);
  EXPECT_LT(SecondsFromFailureToExit(dir, r), 10.0);
  EXPECT_THAT(r.err, HasSubstr("rank 1 (pid"));
  EXPECT_THAT(r.err, HasSubstr("exited with status 3"));
  for (int rank : {0, 2}) {
    const pid_t pid = ReadPid(dir, rank);
    EXPECT_GT(pid, 0) << "rank " << rank << " never started";
    EXPECT_FALSE(Alive(pid)) << "rank " << rank << " (pid " << pid << ") survived";
  }
}

TEST(LauncherTest, WorkerKilledBySignalIsNamed) {
  const std::string dir = NewDir("signal");
  Result r = RunLauncher(
      {"--nproc_per_node=2", "--mode=signal", "--fail_rank=0", absl::StrCat("--pid_dir=", dir)});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(ExitCode(r), 0);
  EXPECT_THAT(r.err, HasSubstr("rank 0 (pid"));
  EXPECT_THAT(r.err, HasSubstr("was killed by signal 9"));
  EXPECT_FALSE(Alive(ReadPid(dir, 1)));
}

// Issue #14: after a SIGSTOP the launcher blamed the rank that timed out
// waiting for the stopped one. The stopped rank is named first.
TEST(LauncherTest, StoppedWorkerIsNamedAsTheRootCause) {
  const std::string dir = NewDir("stopped");
  Result r = RunLauncher({"--nproc_per_node=3", "--mode=fail", "--fail_rank=2",
                          "--fail_after_ms=1500", absl::StrCat("--pid_dir=", dir)},
                         60, [&](pid_t) { StopWorker(dir, 1); });
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(ExitCode(r), 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 1 (pid"));
  EXPECT_THAT(r.err, HasSubstr("was stopped by signal 19"));
  EXPECT_THAT(r.err, HasSubstr("its peers will time out"));
  // The verdict names the stopped rank before the one that failed.
  const size_t verdict = r.err.find("FAILED: ");
  ASSERT_NE(verdict, std::string::npos) << r.err;
  const std::string line = r.err.substr(verdict, r.err.find('\n', verdict) - verdict);
  EXPECT_THAT(line, HasSubstr("FAILED: rank 1 (pid"));
  EXPECT_THAT(line, HasSubstr("the likely root cause); then rank 2 (pid"));
  for (int rank : {0, 1}) EXPECT_FALSE(Alive(ReadPid(dir, rank))) << rank;
}

// Issue #14: the root cause first, by global rank, pipeline stage,
// data-parallel index and the last action it started (what the worker wrote
// to its status page: ParallelGrid and StageExecutor do in an experiment).
TEST(LauncherTest, StoppedWorkerIsNamedWithItsPlaceAndLastAction) {
  const std::string dir = NewDir("stopped_place");
  Result r =
      RunLauncher({"--nproc_per_node=4", "--mode=fail", "--fail_rank=3", "--fail_after_ms=1500",
                   "--report_status", absl::StrCat("--pid_dir=", dir)},
                  60, [&](pid_t) { StopWorker(dir, 2); });
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(ExitCode(r), 3) << r.err;
  const size_t verdict = r.err.find("FAILED: ");
  ASSERT_NE(verdict, std::string::npos) << r.err;
  const std::string line = r.err.substr(verdict, r.err.find('\n', verdict) - verdict);
  EXPECT_THAT(line, HasSubstr("FAILED: rank 2 (pipeline stage 1, data-parallel index 0; last "
                              "action train step 7 1B3) (pid"));
  EXPECT_THAT(line, HasSubstr("(the likely root cause); then rank 3 (pipeline stage 1, "
                              "data-parallel index 1; last action train step 7 1B3) (pid"));
  EXPECT_THAT(line, HasSubstr("exited with status 3"));
  for (int rank : {0, 1, 2}) EXPECT_FALSE(Alive(ReadPid(dir, rank))) << rank;
}

TEST(LauncherTest, KilledWorkerIsNamedWithItsPlaceAndLastAction) {
  const std::string dir = NewDir("killed_place");
  Result r = RunLauncher({"--nproc_per_node=2", "--mode=signal", "--fail_rank=1", "--report_status",
                          absl::StrCat("--pid_dir=", dir)});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_THAT(r.err, HasSubstr("FAILED: rank 1 (pipeline stage 0, data-parallel index 1; last "
                               "action train step 7 0B3) (pid"));
  EXPECT_THAT(r.err, HasSubstr("was killed by signal 9"));
}

TEST(LauncherTest, WorkerIgnoringSigtermGetsSigkill) {
  const std::string dir = NewDir("stubborn");
  Result r = RunLauncher({"--nproc_per_node=2", "--mode=fail", "--fail_rank=0", "--ignore_sigterm",
                          "--launcher_grace_period=1s", absl::StrCat("--pid_dir=", dir)});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(ExitCode(r), 3);
  // Grace period 1 s, then SIGKILL.
  EXPECT_LT(SecondsFromFailureToExit(dir, r), 10.0);
  EXPECT_THAT(r.err, HasSubstr("sending SIGKILL"));
  EXPECT_FALSE(Alive(ReadPid(dir, 1)));
}

TEST(LauncherTest, InterruptStopsEveryone) {
  const std::string dir = NewDir("interrupt");
  Result r =
      RunLauncher({"--nproc_per_node=2", "--mode=hang", absl::StrCat("--pid_dir=", dir)}, 60,
                  [&](pid_t launcher) {
                    // Ctrl-C once both workers run.
                    for (int i = 0; i < 400 && (ReadPid(dir, 0) < 0 || ReadPid(dir, 1) < 0); ++i) {
                      std::this_thread::sleep_for(std::chrono::milliseconds(50));
                    }
                    kill(launcher, SIGINT);
                  });
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(ExitCode(r), 128 + SIGINT) << r.err;
  EXPECT_THAT(r.err, HasSubstr("stopping the workers"));
  EXPECT_FALSE(Alive(ReadPid(dir, 0)));
  EXPECT_FALSE(Alive(ReadPid(dir, 1)));
}

TEST(LauncherTest, ExperimentDefaultForNprocPerNode) {
  Result r = RunLauncher({"--default_nproc=2", "--mode=ok"});
  EXPECT_EQ(ExitCode(r), 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[rank 1] hello from rank 1 of 2"));
  EXPECT_THAT(r.out, Not(HasSubstr("[rank 2]")));
}

// The experiment's check runs in the launcher before any worker starts, also
// when --nproc_per_node is given (it used to be skipped then, and every worker
// refused the config on its own).
TEST(LauncherTest, ExperimentCheckRunsBeforeWorkersEvenWithNprocPerNode) {
  for (const std::string nproc : {"", "--nproc_per_node=2"}) {
    const std::string dir = NewDir(absl::StrCat("refuse", nproc.size()));
    std::vector<std::string> args = {"--refuse_config", "--mode=ok",
                                     absl::StrCat("--pid_dir=", dir)};
    if (!nproc.empty()) args.push_back(nproc);
    Result r = RunLauncher(args);
    ASSERT_FALSE(r.timed_out) << r.err;
    EXPECT_EQ(ExitCode(r), 2) << nproc << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: the experiment refused its config")) << nproc;
    EXPECT_THAT(r.err, Not(HasSubstr("[launcher] starting"))) << nproc;
    EXPECT_THAT(r.err, Not(HasSubstr("[rank "))) << nproc;
    EXPECT_LT(ReadPid(dir, 0), 0) << nproc << ": a worker started";
  }
  // The experiment's default does not override an explicit --nproc_per_node.
  Result r = RunLauncher({"--default_nproc=3", "--nproc_per_node=1", "--mode=ok"});
  EXPECT_EQ(ExitCode(r), 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[rank 0] hello from rank 0 of 1"));
}

TEST(LauncherTest, TwoNodesMeetThroughMasterPort) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  const std::string port_flag = absl::StrCat("--master_port=", *port);
  Result node1;
  std::thread second([&] {
    node1 =
        RunLauncher({"--nnodes=2", "--node_rank=1", "--nproc_per_node=1", port_flag, "--mode=ok"});
  });
  Result node0 =
      RunLauncher({"--nnodes=2", "--node_rank=0", "--nproc_per_node=1", port_flag, "--mode=ok"});
  second.join();
  EXPECT_EQ(ExitCode(node0), 0) << node0.err;
  EXPECT_EQ(ExitCode(node1), 0) << node1.err;
  EXPECT_THAT(node0.out, HasSubstr("[rank 0] hello from rank 0 of 2 local 0/1"));
  EXPECT_THAT(node1.out, HasSubstr("[rank 1] hello from rank 1 of 2 local 0/1"));
  EXPECT_THAT(node1.out, HasSubstr("[rank 1] sum=1"));
}

// --nnodes without --nproc_per_node: the experiment's world size is split over
// the nodes (it used to start the whole world on every node, and the workers
// then refused the doubled world size with a hint to leave the flag unset).
TEST(LauncherTest, NodesSplitTheExperimentWorldSize) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  const std::string port_flag = absl::StrCat("--master_port=", *port);
  Result node1;
  std::thread second([&] {
    node1 = RunLauncher({"--nnodes=2", "--node_rank=1", "--default_nproc=2", port_flag});
  });
  Result node0 = RunLauncher({"--nnodes=2", "--node_rank=0", "--default_nproc=2", port_flag});
  second.join();
  EXPECT_EQ(ExitCode(node0), 0) << node0.err;
  EXPECT_EQ(ExitCode(node1), 0) << node1.err;
  EXPECT_THAT(node0.out, HasSubstr("[rank 0] hello from rank 0 of 2 local 0/1"));
  EXPECT_THAT(node1.out, HasSubstr("[rank 1] hello from rank 1 of 2 local 0/1"));
  EXPECT_THAT(node0.out, Not(HasSubstr("[rank 1]")));

  Result odd = RunLauncher({"--nnodes=2", "--node_rank=0", "--default_nproc=3", port_flag});
  EXPECT_EQ(ExitCode(odd), 2) << odd.err;
  EXPECT_THAT(odd.err, HasSubstr("the experiment needs 3 ranks, which --nnodes=2 does not divide"));
  EXPECT_THAT(odd.err, Not(HasSubstr("starting")));
}

// torchrun's MASTER_PORT / MASTER_ADDR in the environment are honoured when the
// flags are left at their defaults; an explicit flag wins; garbage is named.
TEST(LauncherTest, MasterPortFromTheEnvironment) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  const std::string env_port = std::to_string(*port);
  Result r = RunLauncher({"--nproc_per_node=2", "--mode=ok"}, 60, nullptr,
                         {{"MASTER_PORT", env_port}, {"MASTER_ADDR", "127.0.0.1"}});
  EXPECT_EQ(ExitCode(r), 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("store 127.0.0.1:", env_port, ",")));
  EXPECT_THAT(r.out, HasSubstr("[rank 1] sum=1"));

  auto other = PickFreePort();
  ASSERT_TRUE(other.ok());
  r = RunLauncher({"--nproc_per_node=1", "--mode=ok", absl::StrCat("--master_port=", *other)}, 60,
                  nullptr, {{"MASTER_PORT", env_port}});
  EXPECT_EQ(ExitCode(r), 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("store 127.0.0.1:", *other, ",")));

  r = RunLauncher({"--nproc_per_node=1", "--mode=ok"}, 60, nullptr, {{"MASTER_PORT", "http"}});
  EXPECT_EQ(ExitCode(r), 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("MASTER_PORT='http' in the environment must be in [1, 65535]"));
}

TEST(LauncherTest, BadFlagsAreNamed) {
  Result r = RunLauncher({"--nproc_per_node=-2"});
  EXPECT_EQ(ExitCode(r), 2);
  EXPECT_THAT(r.err, HasSubstr("--nproc_per_node=-2 must be >= 1"));
  r = RunLauncher({"--nnodes=2", "--node_rank=0"});
  EXPECT_EQ(ExitCode(r), 2);
  EXPECT_THAT(r.err, HasSubstr("explicit --master_port"));
  r = RunLauncher({"--nnodes=2", "--node_rank=2", "--master_port=1234"});
  EXPECT_THAT(r.err, HasSubstr("--node_rank=2 must be in [0, --nnodes=2)"));
}

// Issue #42, restarts. Every attempt's workers are new processes that meet
// through a new store on the same port (the passing attempt all-reduces).
TEST(LauncherTest, FailedWorkersAreRestartedUntilTheyPass) {
  Result r = RunLauncher({"--nproc_per_node=2", "--mode=fail", "--fail_rank=1", "--exit_code=3",
                          "--fail_until_restart=2", "--report_step=5", "--step_per_restart=4",
                          "--max_restarts=3", "--restart_delay=0.1s"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(ExitCode(r), 0) << r.out << r.err;
  // Only the passing attempt's rank 0 surely prints before it is stopped (the
  // failing rank exits at once); its environment names the last failure.
  EXPECT_THAT(r.out, ContainsRegex("\\[rank 0\\] attempt 2 of at most 4; cause: rank 1 \\(pid "
                                   "[0-9]+\\) exited with status 3"));
  EXPECT_THAT(r.out, HasSubstr("[rank 1] sum=1"));
  EXPECT_THAT(r.err, ContainsRegex("restart 1/3 in 100ms after rank 1 \\(pid [0-9]+\\) exited "
                                   "with status 3, at training step 5"));
  EXPECT_THAT(r.err, HasSubstr("restart 2/3 in 100ms after"));
  EXPECT_THAT(r.err, HasSubstr("at training step 9"));
  EXPECT_THAT(r.err, Not(HasSubstr("restart 3/3")));
  EXPECT_THAT(r.err, Not(HasSubstr("FAILED")));
}

TEST(LauncherTest, RestartsEndWhenUsedUpOrWithoutProgress) {
  // Progress every time, but only one restart allowed.
  Result r = RunLauncher({"--nproc_per_node=2", "--mode=fail", "--fail_rank=1", "--exit_code=3",
                          "--report_step=5", "--step_per_restart=4", "--max_restarts=1",
                          "--restart_delay=0s"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(ExitCode(r), 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("restart 1/1"));
  EXPECT_THAT(r.err, ContainsRegex("FAILED: rank 1 \\(pid [0-9]+\\) exited with status 3; no "
                                   "restarts left \\(1 of --max_restarts=1 used\\)"));
  // The same step again: the second failure ends the run with restarts left.
  r = RunLauncher({"--nproc_per_node=2", "--mode=signal", "--fail_rank=0", "--report_step=7",
                   "--max_restarts=5", "--restart_delay=0s"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(ExitCode(r), 128 + SIGKILL) << r.err;
  EXPECT_THAT(r.err, HasSubstr("restart 1/5"));
  EXPECT_THAT(r.err, Not(HasSubstr("restart 2/5")));
  EXPECT_THAT(r.err, HasSubstr("was killed by signal 9 (Killed); failed again at training step "
                               "7, as before restart 1, without progress"));
  // --max_restarts=0 (the default): the first failure ends the run, as before.
  r = RunLauncher({"--nproc_per_node=2", "--mode=fail", "--fail_rank=1", "--exit_code=3",
                   "--fail_until_restart=1"});
  EXPECT_EQ(ExitCode(r), 3) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("restart")));
  EXPECT_THAT(r.out, Not(HasSubstr("attempt 1")));
}

TEST(LauncherTest, BadRestartFlagsAreNamed) {
  Result r = RunLauncher({"--max_restarts=-1"});
  EXPECT_EQ(ExitCode(r), 2);
  EXPECT_THAT(r.err, HasSubstr("--max_restarts=-1 must be >= 0"));
  r = RunLauncher({"--restart_delay=-1s"});
  EXPECT_EQ(ExitCode(r), 2);
  EXPECT_THAT(r.err, HasSubstr("--restart_delay=-1s must be >= 0"));
  // Several nodes agree on restarts through a store on --master_port + 1.
  r = RunLauncher({"--nnodes=2", "--node_rank=0", "--master_port=65535", "--max_restarts=1"});
  EXPECT_EQ(ExitCode(r), 2);
  EXPECT_THAT(r.err, HasSubstr("the launchers' restart store takes --master_port + 1, which "
                               "must be a port (<= 65535)"));
  r = RunLauncher({"--nnodes=2", "--node_rank=0", "--master_port=1234", "--max_restarts=1",
                   "--restart_join_timeout=0s"});
  EXPECT_EQ(ExitCode(r), 2);
  EXPECT_THAT(r.err, HasSubstr("--restart_join_timeout=0 must be > 0"));
}

// Ctrl-C while a launcher awaits the other nodes (restart rounds) ends it at
// once with the signal's exit status, naming whom it waited for, instead of
// after --restart_join_timeout: node 0 awaiting node 1's join, and node 1
// awaiting node 0's launcher (its restart store).
TEST(LauncherTest, InterruptWhileAwaitingOtherNodesStopsAtOnce) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  const std::string port_flag = absl::StrCat("--master_port=", *port);
  auto interrupt_after_2s = [](pid_t launcher) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    kill(launcher, SIGINT);
  };
  for (const std::string node : {"0", "1"}) {
    Result r =
        RunLauncher({"--nnodes=2", absl::StrCat("--node_rank=", node), "--nproc_per_node=1",
                     port_flag, "--max_restarts=1", "--restart_join_timeout=300s", "--mode=ok"},
                    60, interrupt_after_2s);
    ASSERT_FALSE(r.timed_out) << "node " << node << ": " << r.err;
    EXPECT_EQ(ExitCode(r), 128 + SIGINT) << "node " << node << ": " << r.err;
    EXPECT_LT(r.seconds, 30) << "node " << node << ": " << r.err;
    EXPECT_THAT(r.err,
                HasSubstr(node == "0" ? "received Interrupt while waiting for node(s) 1 to join "
                                        "restart round 0; stopping"
                                      : "received Interrupt while waiting for node 0's launcher"))
        << "node " << node;
    EXPECT_THAT(r.out, Not(HasSubstr("hello from rank"))) << "node " << node;
  }
}

// The root cause across nodes, the same on every node: a stopped worker
// (its peers time out), else a killed one, else the lowest failed node; a
// node stopped only for another's failure never.
TEST(RestartRoundsTest, RootCauseIsTheSameOnEveryNode) {
  std::vector<NodeOutcome> all = {
      {.node = 0, .ok = false, .worker_failed = true, .cause = "rank 0 exited with status 1"},
      {.node = 1,
       .ok = false,
       .worker_failed = true,
       .cause = "rank 3 (pid 7) was killed by signal 9 (Killed)"},
      {.node = 2, .ok = true}};
  EXPECT_EQ(RestartRounds::RootCause(all),
            "node 1: rank 3 (pid 7) was killed by signal 9 (Killed)");
  all[0].cause = "rank 1 (pid 5) was stopped by signal 19 (Stopped) 2.0 s earlier";
  EXPECT_EQ(RestartRounds::RootCause(all),
            "node 0: rank 1 (pid 5) was stopped by signal 19 (Stopped) 2.0 s earlier");
  all[0].stopped_for_other_node = true;
  EXPECT_EQ(RestartRounds::RootCause(all),
            "node 1: rank 3 (pid 7) was killed by signal 9 (Killed)");
  all[1].ok = true;
  EXPECT_EQ(RestartRounds::RootCause(all), "");
}

// Issue 29: MASTER_ADDR=999.1.1.1 was reported only after the workers' 120 s
// store timeout. An address that does not resolve is refused by the launcher
// before any worker starts, naming it.
TEST(LauncherTest, UnresolvableMasterAddrIsRefusedAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  Result r =
      RunLauncher({"--nproc_per_node=2", "--mode=ok"}, 60, nullptr, {{"MASTER_ADDR", "999.1.1.1"}});
  EXPECT_EQ(ExitCode(r), 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("master address '999.1.1.1' (--master_addr or MASTER_ADDR) does "
                               "not resolve"));
  EXPECT_THAT(r.err, Not(HasSubstr("starting")));
  r = RunLauncher({"--nproc_per_node=1", "--mode=ok", "--master_addr=no-such-host.invalid"});
  EXPECT_EQ(ExitCode(r), 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("'no-such-host.invalid'"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(40));
}

TEST(LauncherTest, WorkersUseAndReportTheThreadFlags) {
  Result r =
      RunLauncher({"--nproc_per_node=2", "--mode=ok", "--intra_op_threads=2", "--blas_threads=2"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(ExitCode(r), 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("asking each for 2 intra-op + 2 BLAS thread(s)"));
  for (int rank = 0; rank < 2; ++rank) {
    // What the worker itself saw, and what the launcher had it report.
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("[rank ", rank, "] hello from rank ", rank,
                                              " of 2 local ", rank, "/2 omp=2 threads=2\n")));
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat(
                           "[launcher] rank ", rank, " threads: 2 intra-op + 2 BLAS thread(s) (",
                           torch_compat::BlasName(torch_compat::BlasInUse()), ")")));
    // Not bound: each worker reports the launcher's own cores.
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("; cores ", DescribeCores(AllowedCores()),
                                              " (not bound)\n")));
    // Both malloc thresholds, never one alone (see WorkerVariables).
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat(
                           "[rank ", rank,
                           "] malloc mmap_threshold=33554432 trim_threshold=1073741824\n")));
  }
  // Counts that differ: with MKL, at::set_num_threads sets the BLAS count too,
  // so only a BLAS count of its own shows that the worker's setting held.
  r = RunLauncher({"--nproc_per_node=1", "--mode=ok", "--intra_op_threads=1", "--blas_threads=3"});
  ASSERT_EQ(ExitCode(r), 0) << r.out << r.err;
  EXPECT_THAT(r.err,
              HasSubstr(absl::StrCat("[launcher] rank 0 threads: 1 intra-op + 3 BLAS thread(s) (",
                                     torch_compat::BlasName(torch_compat::BlasInUse()), ")")));
  r = RunLauncher({"--nproc_per_node=1", "--mode=ok", "--blas_threads=-1"});
  EXPECT_EQ(ExitCode(r), 2);
  EXPECT_THAT(r.err, HasSubstr("--blas_threads=-1"));
}

// Issue #43: the launcher names the BLAS, its kernel and the CPU; a user's
// OPENBLAS_CORETYPE reaches the workers unchanged (they report the kernel it
// forced) and, where it is generic on a CPU with AVX2, the launcher says what
// it costs. Unset, workers run the kernel OpenBLAS picks (or the launcher's
// fix for a generic one: blas_kernel_test covers that decision).
TEST(LauncherTest, BlasKernelIsReportedAndAUsersSettingIsKept) {
  if (torch_compat::BlasInUse() != torch_compat::Blas::kOpenBlas) GTEST_SKIP() << "not OpenBLAS";
  Result r = RunLauncher({"--nproc_per_node=2", "--mode=ok"}, 60, nullptr,
                         {{"OPENBLAS_CORETYPE", "Prescott"}});
  ASSERT_EQ(ExitCode(r), 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("[launcher] BLAS OpenBLAS"));
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat(
                         ", kernel Prescott (generic, forced by OPENBLAS_CORETYPE=Prescott), CPU ",
                         ThisCpu().model)));
  const std::string best = BestOpenBlasCoreType(ThisCpu());
  if (!best.empty()) {
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("OPENBLAS_CORETYPE=Prescott is set, on a CPU (",
                                              ThisCpu().model, ") that runs its faster ", best,
                                              " kernel; kept")));
  }
  EXPECT_THAT(r.err, Not(HasSubstr("starting the workers with OPENBLAS_CORETYPE")));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(r.err, ContainsRegex(absl::StrCat("\\[launcher\\] rank ", rank,
                                                  " threads: [^\n]*; BLAS kernel Prescott;")));
  }
  r = RunLauncher({"--nproc_per_node=1", "--mode=ok"});
  ASSERT_EQ(ExitCode(r), 0) << r.out << r.err;
  const std::string core = torch_compat::BlasCoreName();
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat(", kernel ", core)));
  if (!IsGenericOpenBlasCore(core)) {
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("; BLAS kernel ", core, ";")));
  } else if (!best.empty()) {
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("; BLAS kernel ", best, ";")));
  }
}

TEST(LauncherTest, BindCoresBindsEachWorkerAndReportsIt) {
  const std::vector<int> allowed = AllowedCores();
  ASSERT_FALSE(allowed.empty());
  constexpr int kWorkers = 3;
  Result r = RunLauncher({"--nproc_per_node=3", "--mode=ok", "--bind_cores"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(ExitCode(r), 0) << r.out << r.err;
  EXPECT_THAT(r.err,
              HasSubstr(absl::StrCat("binding each to its cores of ", DescribeCores(allowed))));
  for (int rank = 0; rank < kWorkers; ++rank) {
    // Read back by the worker itself (sched_getaffinity), after exec.
    EXPECT_THAT(r.err,
                ContainsRegex(absl::StrCat("\\[launcher\\] rank ", rank, " threads: [^\n]*; cores ",
                                           DescribeCores(CoresForWorker(allowed, rank, kWorkers)),
                                           " \\(bound by --bind_cores, read back\\)\n")));
  }
}

}  // namespace
}  // namespace pp
