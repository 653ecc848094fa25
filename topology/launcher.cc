#include "topology/launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "common/torch_compat_blas.h"
#include "topology/blas_kernel.h"
#include "topology/launcher_status.h"
#include "topology/rendezvous.h"
#include "topology/reserved_port.h"
#include "topology/restart_rounds.h"

extern char** environ;

ABSL_FLAG(int, nproc_per_node, 0,
          "Launcher: worker processes to start on this node (0: the experiment's world size, "
          "e.g. pp*dp*mp, divided by --nnodes; else 1). Ignored in a worker (RANK set).");
ABSL_FLAG(int, nnodes, 1,
          "Launcher: number of nodes (each runs this binary with its --node_rank).");
ABSL_FLAG(int, node_rank, 0, "Launcher: this node's index in [0, --nnodes).");
ABSL_FLAG(std::string, master_addr, "127.0.0.1",
          "Launcher: address of node 0, where rank 0 hosts the TCP store (MASTER_ADDR from the "
          "environment when left at 127.0.0.1).");
ABSL_FLAG(int, master_port, 0,
          "Launcher: TCP store port on --master_addr; 0: MASTER_PORT from the environment if set, "
          "else a free port (single node only).");
ABSL_FLAG(std::string, run_id, "",
          "Launcher: this run's id, checked by every rank against the store's so that a rank of "
          "another launch on the same port is refused; empty: a random one on a single node, "
          "none (no check) with --nnodes > 1 unless every node passes the same. Also read from "
          "PP_RUN_ID.");
ABSL_FLAG(absl::Duration, launcher_grace_period, absl::Seconds(5),
          "Launcher: how long workers get between SIGTERM and SIGKILL when stopped.");
ABSL_FLAG(int, max_restarts, 0,
          "Launcher: times every worker is started again after one fails, is killed or stalls "
          "past its timeout (torchrun's flag); a training run resumes from its newest checkpoint "
          "that verifies. 0: a failure ends the run.");
ABSL_FLAG(absl::Duration, restart_delay, absl::Seconds(1),
          "Launcher: wait between stopping a failed attempt's workers and starting them again "
          "(--max_restarts).");
ABSL_FLAG(absl::Duration, restart_join_timeout, absl::Minutes(5),
          "Launcher, --max_restarts with --nnodes > 1: how long each node's launcher waits for "
          "the others to join a restart round or report its end; a node missing then ends the "
          "run, named (torchrun's rendezvous join_timeout).");
ABSL_FLAG(int, intra_op_threads, 0,
          "Launcher: intra-op (at::set_num_threads) threads per worker; 0: PP_INTRA_OP_THREADS, "
          "else OMP_NUM_THREADS, else 1.");
ABSL_FLAG(int, blas_threads, 0,
          "Launcher: BLAS (OpenBLAS or MKL, whichever LibTorch uses) threads per worker; 0: "
          "PP_BLAS_THREADS, else the BLAS's own OPENBLAS_NUM_THREADS / MKL_NUM_THREADS, else "
          "OMP_NUM_THREADS, else cores / local workers.");
ABSL_FLAG(bool, bind_cores, false,
          "Launcher: bind each worker to its own cores before it starts (one core each, "
          "round-robin, when workers >= cores; else an even contiguous share), as DeepSpeed's "
          "--bind_cores_to_rank. Measured: +5% for interleaved 1F1B with 4 ranks on 2 cores, "
          "no change at pp = 2 (docs/performance.md).");

namespace pp {
namespace {

// Written by the signal handler, read by the event loop (self-pipe trick).
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int signo) {
  const int saved = errno;
  const char byte = static_cast<char>(signo);
  (void)!::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

// One output stream of one worker: lines get the rank prefix.
struct Stream {
  int fd = -1;          // read end; -1 once closed
  int out_fd = 1;       // where prefixed lines go (1 or 2)
  std::string pending;  // bytes after the last newline
};

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  bool running = true;
  int wait_status = 0;
  // Stopped (SIGSTOP, SIGTSTP, ...) and not continued since: its peers will
  // time out waiting for it, so it is the root cause of what follows.
  int stop_signal = 0;
  std::chrono::steady_clock::time_point stopped_at;
  Stream out, err;
  // Where the worker reports its grid place and current action; null when
  // the page could not be made (the verdict then gives the rank only).
  std::unique_ptr<WorkerStatusPage> status;
};

// "rank 2 (pipeline stage 0, data-parallel index 1; last action train step 5
// 0B3)", with what the worker reported (just "rank 2" when nothing).
std::string WorkerName(const Worker& w) {
  const std::string known = w.status == nullptr ? "" : WorkerStatusPage::Describe(w.status->Read());
  return known.empty() ? absl::StrCat("rank ", w.rank)
                       : absl::StrCat("rank ", w.rank, " (", known, ")");
}

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // launcher's own output is gone; nothing to do
    done += static_cast<size_t>(n);
  }
}

void Say(const std::string& message) { WriteAll(2, absl::StrCat("[launcher] ", message, "\n")); }

// A worker's line that starts with this is the launcher's to say (the
// worker's thread report), not the worker's: "[launcher] rank N ..." instead of
// "[rank N] ...", so ranks other than 0 still print nothing of their own.
constexpr absl::string_view kLauncherLineTag = "@pp-launcher@ ";

// Prefixes every complete line in `stream.pending` (all of it at EOF).
void FlushLines(int rank, Stream& stream, bool eof) {
  const std::string prefix = absl::StrCat("[rank ", rank, "] ");
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = stream.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    absl::string_view line = absl::string_view(stream.pending).substr(start, nl + 1 - start);
    if (absl::ConsumePrefix(&line, kLauncherLineTag)) {
      absl::StrAppend(&out, "[launcher] rank ", rank, " ", line);
      continue;
    }
    absl::StrAppend(&out, prefix, line);
  }
  stream.pending.erase(0, start);
  if (eof && !stream.pending.empty()) {
    absl::StrAppend(&out, prefix, stream.pending, "\n");
    stream.pending.clear();
  }
  if (!out.empty()) WriteAll(stream.out_fd, out);
}

// Reads what is available; closes the stream at EOF.
void Drain(int rank, Stream& stream) {
  char buffer[65536];
  const ssize_t n = ::read(stream.fd, buffer, sizeof(buffer));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    ::close(stream.fd);
    stream.fd = -1;
    FlushLines(rank, stream, /*eof=*/true);
    return;
  }
  stream.pending.append(buffer, static_cast<size_t>(n));
  FlushLines(rank, stream, /*eof=*/false);
}

std::string HowItEnded(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return absl::StrCat("was killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return absl::StrCat("ended with wait status ", wait_status);
}

bool Failed(int wait_status) { return !WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0; }

// The exit status a shell would report for a worker that ended this way.
int ShellStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

void SignalRunning(std::vector<Worker>& workers, int signo) {
  for (Worker& w : workers) {
    if (w.running) ::kill(w.pid, signo);
  }
}

// KEY=VALUE strings of the launcher's environment with `overrides` replacing
// or adding keys.
std::vector<std::string> WorkerEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const auto& [key, value] : overrides) {
      replaced = replaced || absl::StartsWith(entry, key + "=");
    }
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [key, value] : overrides) env.push_back(absl::StrCat(key, "=", value));
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

absl::Status Validate(const LaunchOptions& o) {
  if (o.nproc_per_node < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nproc_per_node=", o.nproc_per_node, " must be >= 1"));
  }
  if (o.nnodes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--nnodes=", o.nnodes, " must be >= 1"));
  }
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node_rank=", o.node_rank, " must be in [0, --nnodes=", o.nnodes, ")"));
  }
  if (o.master_port < 0 || o.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--master_port=", o.master_port, " must be in [0, 65535]"));
  }
  if (o.master_port == 0 && o.nnodes > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--nnodes=", o.nnodes, " needs an explicit --master_port that every node uses"));
  }
  if (o.master_addr.empty()) return absl::InvalidArgumentError("--master_addr is empty");
  if (o.max_restarts < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max_restarts=", o.max_restarts,
                                                   " must be >= 0 (0: a failure ends the run)"));
  }
  if (o.restart_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--restart_delay=", absl::FormatDuration(o.restart_delay), " must be >= 0"));
  }
  if (o.max_restarts > 0 && o.nnodes > 1) {
    // The launchers agree on every restart through a store of their own on
    // the next port (restart_rounds.h).
    if (o.master_port + 1 > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--master_port=", o.master_port,
          " with --max_restarts and --nnodes > 1: the "
          "launchers' restart store takes --master_port + 1, which must be a port (<= 65535)"));
    }
    if (o.restart_join_timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--restart_join_timeout=", absl::FormatDuration(o.restart_join_timeout), " must be > 0"));
    }
  }
  {
    // Every worker would wait for the store there until its timeout (minutes)
    // before saying it cannot reach it; a name or address that does not even
    // resolve is refused now.
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(o.master_addr.c_str(), nullptr, &hints, &found);
    if (found != nullptr) ::freeaddrinfo(found);
    if (rc != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "master address '", o.master_addr, "' (--master_addr or MASTER_ADDR) does not resolve (",
          ::gai_strerror(rc),
          "): give the IP address or host name of the node that runs rank 0 (127.0.0.1 on one "
          "machine)"));
    }
  }
  if (o.intra_op_threads < 0 || o.blas_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--intra_op_threads=", o.intra_op_threads,
                                                   " and --blas_threads=", o.blas_threads,
                                                   " must be >= 0 (0: automatic)"));
  }
  if (o.grace_period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--launcher_grace_period=", absl::FormatDuration(o.grace_period), " is negative"));
  }
  return absl::OkStatus();
}

// 16 hex digits from the kernel's random source (time and pid if unreadable).
std::string RandomRunId() {
  uint64_t value = 0;
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::read(fd, &value, sizeof(value)) != static_cast<ssize_t>(sizeof(value))) {
    value = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
            (static_cast<uint64_t>(::getpid()) << 32);
  }
  if (fd >= 0) ::close(fd);
  return absl::StrFormat("%016x", value);
}

// This launcher process's id, the same for all its workers: the rendezvous
// refuses a rank whose node's ranks another launch started (DistEnv::launch_id).
const std::string& LaunchId() {
  static const std::string* id = new std::string(RandomRunId());
  return *id;
}

// Path of this binary, which the workers re-execute.
std::string SelfExecutable() {
  char exe[4096];
  const ssize_t exe_len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  return exe_len > 0 ? std::string(exe, exe_len) : "/proc/self/exe";
}

// While alive: Ctrl-C / SIGTERM / SIGHUP reach the event loop through
// g_signal_pipe, and a worker's closed pipe does not kill the launcher.
// Restores the previous dispositions when destroyed.
class SignalForwarding {
 public:
  static absl::StatusOr<std::unique_ptr<SignalForwarding>> Install() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
    }
    auto forwarding = std::unique_ptr<SignalForwarding>(new SignalForwarding());
    struct sigaction action {};
    action.sa_handler = OnSignal;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGINT, &action, &forwarding->old_int_);
    ::sigaction(SIGTERM, &action, &forwarding->old_term_);
    ::sigaction(SIGHUP, &action, &forwarding->old_hup_);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &forwarding->old_pipe_);
    return forwarding;
  }
  ~SignalForwarding() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGHUP, &old_hup_, nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
    g_signal_pipe[0] = g_signal_pipe[1] = -1;
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  SignalForwarding() = default;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
  struct sigaction old_hup_ {};
  struct sigaction old_pipe_ {};
};

// torchrun's variables for the worker of local index `local`, and its
// resolved thread counts (OMP_NUM_THREADS and the BLAS's own variable too, so
// the libraries size their pools right when they load).
std::vector<std::pair<std::string, std::string>> WorkerVariables(const LaunchOptions& options,
                                                                 int port, int local,
                                                                 WorkerThreads threads,
                                                                 const WorkerRestart& restart) {
  const int world_size = options.nproc_per_node * options.nnodes;
  std::vector<std::pair<std::string, std::string>> vars = {
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(port)},
      {"RANK", std::to_string(options.node_rank * options.nproc_per_node + local)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_RANK", std::to_string(local)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
  };
  if (!options.run_id.empty()) vars.emplace_back(kRunIdVariable, options.run_id);
  vars.emplace_back(kLaunchIdVariable, LaunchId());
  vars.emplace_back(kRestartCountVariable, std::to_string(restart.count));
  vars.emplace_back(kMaxRestartsVariable, std::to_string(restart.max_restarts));
  vars.emplace_back(kRestartCauseVariable, restart.cause);
  for (auto& var : WorkerThreadVariables(threads)) vars.push_back(std::move(var));
  for (auto& var : WorkerMallocVariables()) vars.push_back(std::move(var));
  return vars;
}

// Forks and execs one worker with `env`, its stdout/stderr on pipes the
// launcher reads. On failure `w` is left not running.
// `cores` non-empty: the worker is bound to them before exec (threads it
// starts later inherit the binding).
absl::Status SpawnWorker(const std::string& exe_path, std::vector<char*>& c_args,
                         std::vector<std::string> env, pid_t launcher_pid,
                         const std::vector<int>& cores, Worker& w) {
  const int status_fd = w.status != nullptr ? w.status->fd() : -1;
  cpu_set_t core_set;
  CPU_ZERO(&core_set);
  for (int core : cores) CPU_SET(core, &core_set);
  std::vector<char*> c_env = CStrings(env);
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    w.running = false;
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    // This worker's status page only (every page is close-on-exec).
    if (status_fd >= 0) ::fcntl(status_fd, F_SETFD, 0);
    // Die with the launcher even when it is SIGKILLed.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher_pid) ::_exit(1);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGPIPE, &dfl, nullptr);  // ignored dispositions survive exec
    if (!cores.empty() && ::sched_setaffinity(0, sizeof(core_set), &core_set) != 0) {
      const char msg[] = "launcher: sched_setaffinity of the worker failed (--bind_cores)\n";
      (void)!::write(2, msg, sizeof(msg) - 1);
      ::_exit(127);
    }
    ::execve(exe_path.c_str(), c_args.data(), c_env.data());
    const char msg[] = "launcher: execve of the worker failed\n";
    (void)!::write(2, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    w.running = false;
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  w.pid = pid;
  w.out = Stream{out_pipe[0], 1, ""};
  w.err = Stream{err_pipe[0], 2, ""};
  return absl::OkStatus();
}

// Starts this node's workers; stops at the first that cannot be spawned (it
// and the later ones are marked not running) and returns that error.
absl::Status SpawnWorkers(const LaunchOptions& options, int port, WorkerThreads threads,
                          const BlasKernelPlan& blas, const WorkerRestart& restart,
                          const std::vector<std::string>& argv, std::vector<Worker>& workers) {
  const std::string exe_path = SelfExecutable();
  std::vector<std::string> args = argv;
  args[0] = exe_path;
  std::vector<char*> c_args = CStrings(args);
  const pid_t launcher_pid = ::getpid();
  const std::vector<int> allowed = options.bind_cores ? AllowedCores() : std::vector<int>();
  absl::Status spawn_error;
  for (int local = 0; local < options.nproc_per_node; ++local) {
    Worker& w = workers[local];
    w.rank = options.node_rank * options.nproc_per_node + local;
    std::vector<std::pair<std::string, std::string>> vars =
        WorkerVariables(options, port, local, threads, restart);
    if (!blas.coretype.empty()) vars.emplace_back(kOpenBlasCoreTypeVariable, blas.coretype);
    absl::StatusOr<std::unique_ptr<WorkerStatusPage>> page = WorkerStatusPage::Create();
    if (page.ok()) {
      w.status = *std::move(page);
      vars.emplace_back(kWorkerStatusFdVariable, std::to_string(w.status->fd()));
    } else {
      Say(absl::StrCat("rank ", w.rank, " gets no status page (", page.status().message(),
                       "); a failure will name its rank only"));
    }
    const std::vector<int> cores = CoresForWorker(allowed, local, options.nproc_per_node);
    if (options.bind_cores) vars.emplace_back(kBoundCoresVariable, DescribeCores(cores));
    spawn_error = SpawnWorker(exe_path, c_args, WorkerEnvironment(vars), launcher_pid, cores, w);
    if (!spawn_error.ok()) break;
  }
  for (Worker& w : workers) {
    if (w.pid < 0) w.running = false;
  }
  return spawn_error;
}

// Waits `delay`; returns early with the signal that arrived (SIGINT, SIGTERM,
// SIGHUP through g_signal_pipe), 0 when none did.
int WaitForSignal(absl::Duration delay) {
  const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(delay);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    pollfd fd = {g_signal_pipe[0], POLLIN, 0};
    if (::poll(&fd, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) > 0) {
      char signo = 0;
      if (::read(g_signal_pipe[0], &signo, 1) == 1) return signo;
    }
    if (std::chrono::steady_clock::now() >= until) return 0;
  }
}

// The event loop over running workers: forwards their output with rank
// prefixes, stops all when one fails or a signal arrives (SIGTERM, then
// SIGKILL after the grace period), and ends when every worker has exited.
class Supervisor {
 public:
  // `other_node_failure`, when given (several nodes with restarts), says
  // whether another node's attempt failed; this node then stops its workers.
  using OtherNodeFailure = std::function<std::optional<std::string>()>;
  Supervisor(const LaunchOptions& options, std::vector<Worker>& workers,
             OtherNodeFailure other_node_failure = nullptr)
      : options_(options), workers_(workers), other_node_failure_(std::move(other_node_failure)) {}

  // The launcher's exit status: 0, or the first failure's (with Say()).
  int Run(const absl::Status& spawn_error) {
    if (!spawn_error.ok()) BeginStop(spawn_error.ToString(), 1);
    Clock::time_point all_exited_at{};
    Clock::time_point next_look{};
    while (true) {
      PollOnce();
      ReapExited();
      if (other_node_failure_ && !stopping_ && Clock::now() >= next_look) {
        next_look = Clock::now() + std::chrono::milliseconds(200);
        if (std::optional<std::string> cause = other_node_failure_(); cause.has_value()) {
          Say(absl::StrCat("another node's attempt failed (", *cause,
                           "); stopping this node's workers"));
          BeginStop(*cause, 1);
          worker_failed_ = true;
          stopped_for_other_node_ = true;
        }
      }
      const bool any_running = AnyRunning();
      if (stopping_ && !killed_ && any_running && Clock::now() >= kill_at_) {
        Say(absl::StrCat("workers still running ", absl::FormatDuration(options_.grace_period),
                         " after SIGTERM; sending SIGKILL"));
        SignalRunning(workers_, SIGKILL);
        killed_ = true;
      }
      if (!any_running) {
        if (all_exited_at == Clock::time_point{}) all_exited_at = Clock::now();
        // A grandchild may hold a pipe open; do not wait for it for long.
        if (!AnyStreamOpen() || Clock::now() - all_exited_at > std::chrono::seconds(1)) break;
      }
    }
    CloseStreams();
    return result_;
  }

  // Why Run() returned non-zero.
  const std::string& verdict() const { return verdict_; }
  // Whether a worker's failure stopped the attempt (not a signal to the
  // launcher or a worker that could not be started): what a restart is for.
  bool worker_failed() const { return worker_failed_; }
  // Whether another node's failure stopped this node's workers.
  bool stopped_for_other_node() const { return stopped_for_other_node_; }
  // The furthest training step any worker reported (-1: none).
  int64_t FurthestStep() const {
    int64_t step = -1;
    for (const Worker& w : workers_) {
      if (w.status != nullptr) step = std::max(step, w.status->Read().step);
    }
    return step;
  }

 private:
  using Clock = std::chrono::steady_clock;

  void BeginStop(const std::string& why, int status) {
    if (stopping_) return;
    stopping_ = true;
    result_ = status;
    verdict_ = why;
    // A stopped worker explains its peers' timeouts: name it first.
    for (const Worker& w : workers_) {
      if (!w.running || w.stop_signal == 0) continue;
      const double seconds = std::chrono::duration<double>(Clock::now() - w.stopped_at).count();
      verdict_ = absl::StrFormat(
          "%s (pid %d) was stopped by signal %d (%s) %.1f s earlier and never continued "
          "(the likely root cause); then %s",
          WorkerName(w), w.pid, w.stop_signal, strsignal(w.stop_signal), seconds, why);
      break;
    }
    kill_at_ = Clock::now() + absl::ToChronoNanoseconds(options_.grace_period);
    SignalRunning(workers_, SIGTERM);
    // A stopped process acts on SIGTERM only once it runs again.
    for (const Worker& w : workers_) {
      if (w.running && w.stop_signal != 0) ::kill(w.pid, SIGCONT);
    }
  }

  // Waits up to 50 ms for signals or worker output and handles what came.
  void PollOnce() {
    std::vector<pollfd> fds = {{g_signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<Worker*, Stream*>> owners = {{nullptr, nullptr}};
    for (Worker& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&w, s);
        }
      }
    }
    ::poll(fds.data(), fds.size(), /*timeout_ms=*/50);
    if (fds[0].revents & POLLIN) HandleSignals();
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR))
        Drain(owners[i].first->rank, *owners[i].second);
    }
  }

  void HandleSignals() {
    char signals[16];
    const ssize_t n = ::read(g_signal_pipe[0], signals, sizeof(signals));
    for (ssize_t i = 0; i < n; ++i) {
      const int signo = signals[i];
      if (stopping_) {
        // A second Ctrl-C: no more patience.
        Say(absl::StrCat("received ", strsignal(signo), " again; killing the workers"));
        SignalRunning(workers_, SIGKILL);
        killed_ = true;
      } else {
        Say(absl::StrCat("received ", strsignal(signo), "; stopping the workers"));
        BeginStop(absl::StrCat("stopped by ", strsignal(signo)), 128 + signo);
      }
    }
  }

  void ReapExited() {
    for (Worker& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      if (::waitpid(w.pid, &status, WNOHANG | WUNTRACED | WCONTINUED) != w.pid) continue;
      if (WIFSTOPPED(status)) {
        w.stop_signal = WSTOPSIG(status);
        w.stopped_at = Clock::now();
        Say(absl::StrCat(WorkerName(w), " (pid ", w.pid, ") was stopped by signal ", w.stop_signal,
                         " (", strsignal(w.stop_signal),
                         "); its peers will time out unless it is continued"));
        continue;
      }
      if (WIFCONTINUED(status)) {
        if (w.stop_signal != 0) Say(absl::StrCat("rank ", w.rank, " (pid ", w.pid, ") continued"));
        w.stop_signal = 0;
        continue;
      }
      w.running = false;
      w.wait_status = status;
      if (Failed(status) && !stopping_) {
        const std::string how =
            absl::StrCat(WorkerName(w), " (pid ", w.pid, ") ", HowItEnded(status));
        const int others = static_cast<int>(std::count_if(
            workers_.begin(), workers_.end(), [](const Worker& x) { return x.running; }));
        Say(absl::StrCat(how, "; stopping the other ", others, " worker(s)"));
        BeginStop(how, ShellStatus(status));
        worker_failed_ = true;
      }
    }
  }

  bool AnyRunning() const {
    return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
  }

  bool AnyStreamOpen() const {
    return std::any_of(workers_.begin(), workers_.end(),
                       [](const Worker& w) { return w.out.fd >= 0 || w.err.fd >= 0; });
  }

  // Closes what is still open and flushes partial last lines.
  void CloseStreams() {
    for (Worker& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd >= 0) {
          ::close(s->fd);
          s->fd = -1;
        }
        FlushLines(w.rank, *s, /*eof=*/true);
      }
    }
  }

  const LaunchOptions& options_;
  std::vector<Worker>& workers_;
  OtherNodeFailure other_node_failure_;
  bool stopped_for_other_node_ = false;
  bool stopping_ = false;
  bool killed_ = false;
  bool worker_failed_ = false;
  Clock::time_point kill_at_;
  int result_ = 0;       // exit status of the launcher
  std::string verdict_;  // why it is non-zero
};

// A worker another launcher started (torchrun) on a generic OpenBLAS kernel
// that the CPU can beat: the variable is read only when OpenBLAS loads, so the
// worker runs itself again with it set (the second run finds it set and goes
// on). pipe's own launcher sets it before its workers start.
void ReexecWithBetterBlasKernel(char** argv) {
  const BlasKernelPlan plan = PlanBlasKernel(ThisBlasKernel());
  if (!plan.warning.empty()) LOG(WARNING) << plan.warning;
  if (plan.coretype.empty()) return;
  ::setenv(kOpenBlasCoreTypeVariable, plan.coretype.c_str(), /*overwrite=*/0);
  const std::string exe = SelfExecutable();
  ::execv(exe.c_str(), argv);
  LOG(WARNING) << "OpenBLAS runs a generic kernel (" << torch_compat::BlasCoreName()
               << ") on a CPU with AVX2, and re-executing " << exe << " with "
               << kOpenBlasCoreTypeVariable << "=" << plan.coretype
               << " failed: " << std::strerror(errno) << "; set " << kOpenBlasCoreTypeVariable
               << "=" << plan.coretype << " in the workers' environment for the fast kernel";
}

}  // namespace

absl::StatusOr<int> RunWorkers(const LaunchOptions& options, const std::vector<std::string>& argv) {
  PP_RETURN_IF_ERROR(Validate(options));
  if (argv.empty()) return absl::InvalidArgumentError("RunWorkers needs argv[0]");
  int port = options.master_port;
  // Held until the workers end, restarts included (reserved_port.h): rank 0
  // binds it seconds later, after its process has started.
  std::optional<ReservedPort> reserved_port;
  if (port == 0) {
    PP_ASSIGN_OR_RETURN(
        reserved_port,
        ReservedPort::OnFreePort(IsLoopbackAddress(options.master_addr) ? "127.0.0.1" : "0.0.0.0"));
    port = reserved_port->port();
  }
  const int world_size = options.nproc_per_node * options.nnodes;
  PP_ASSIGN_OR_RETURN(
      const WorkerThreads threads,
      ResolveWorkerThreads(options.nproc_per_node,
                           {.intra_op = options.intra_op_threads, .blas = options.blas_threads}));
  PP_ASSIGN_OR_RETURN(std::unique_ptr<SignalForwarding> signals, SignalForwarding::Install());
  Say(absl::StrFormat(
      "starting %d worker(s): ranks %d-%d of %d on node %d/%d, store %s:%d, asking each for %s%s%s",
      options.nproc_per_node, options.node_rank * options.nproc_per_node,
      (options.node_rank + 1) * options.nproc_per_node - 1, world_size, options.node_rank,
      options.nnodes, options.master_addr, port, DescribeThreads(threads),
      options.bind_cores
          ? absl::StrCat(", binding each to its cores of ", DescribeCores(AllowedCores()))
          : "",
      options.run_id.empty() ? "" : absl::StrCat(", run id ", options.run_id)));
  // The kernel this process's OpenBLAS picked is the one workers get unless
  // it is a generic one and the user has not chosen it (blas_kernel.h).
  const BlasKernel blas = ThisBlasKernel();
  const BlasKernelPlan blas_plan = PlanBlasKernel(blas);
  Say(DescribeBlasKernel(blas));
  if (!blas_plan.warning.empty()) Say(blas_plan.warning);
  if (!blas_plan.coretype.empty()) {
    Say(absl::StrCat("OpenBLAS fell back to its generic ", blas.core,
                     " kernel on this CPU; starting the workers with ", kOpenBlasCoreTypeVariable,
                     "=", blas_plan.coretype));
  }
  WorkerRestart restart{.count = 0, .max_restarts = options.max_restarts, .cause = ""};
  int64_t previous_failed_step = -1;
  // Several nodes with restarts: every node's launcher restarts with the
  // others, round by round (restart_rounds.h).
  std::unique_ptr<RestartRounds> rounds;
  // A signal that arrives while the other nodes are awaited ends the wait
  // (Ctrl-C must not wait out --restart_join_timeout).
  int awaiting_signal = 0;
  auto end_of_rounds = [&](const absl::Status& status, int failed_result) {
    Say(absl::StrCat(awaiting_signal != 0 ? "" : "FAILED: ", status.message()));
    return awaiting_signal != 0 ? 128 + awaiting_signal : failed_result;
  };
  if (options.nnodes > 1 && options.max_restarts > 0) {
    absl::StatusOr<std::unique_ptr<RestartRounds>> connected = RestartRounds::Connect(
        options.master_addr, port + 1, options.node_rank, options.nnodes,
        options.restart_join_timeout,
        [&awaiting_signal] { return awaiting_signal = WaitForSignal(absl::ZeroDuration()); });
    if (!connected.ok()) return end_of_rounds(connected.status(), 1);
    rounds = *std::move(connected);
    Say(absl::StrCat("restarts agreed with the other ", options.nnodes - 1,
                     " node(s) through the launchers' store at ", options.master_addr, ":",
                     port + 1));
  }
  for (int round = 0;; ++round) {
    if (rounds != nullptr) {
      if (absl::Status joined = rounds->Join(round); !joined.ok()) return end_of_rounds(joined, 1);
    }
    std::vector<Worker> workers(options.nproc_per_node);
    const absl::Status spawned =
        SpawnWorkers(options, port, threads, blas_plan, restart, argv, workers);
    Supervisor supervisor(
        options, workers, rounds == nullptr ? Supervisor::OtherNodeFailure() : [&rounds, round] {
          return rounds->Failure(round);
        });
    int result = supervisor.Run(spawned);
    int64_t failed_step = supervisor.FurthestStep();
    bool worker_failed = supervisor.worker_failed();
    std::string cause = supervisor.verdict();
    if (rounds != nullptr) {
      // Every node decides from the same facts: each node's outcome.
      // Any failure of its own (a worker's, or a signal to this launcher)
      // stops the other nodes' workers at once, not after their timeouts.
      if (result != 0 && !supervisor.stopped_for_other_node()) {
        rounds->PostFailure(round, supervisor.verdict());
      }
      const NodeOutcome mine{.node = options.node_rank,
                             .ok = result == 0,
                             .worker_failed = worker_failed,
                             .stopped_for_other_node = supervisor.stopped_for_other_node(),
                             .furthest_step = failed_step,
                             .cause = supervisor.verdict()};
      absl::StatusOr<std::vector<NodeOutcome>> all = rounds->Finish(round, mine);
      if (!all.ok()) return end_of_rounds(all.status(), result != 0 ? result : 1);
      bool every_ok = true;
      worker_failed = true;
      for (const NodeOutcome& o : *all) {
        failed_step = std::max(failed_step, o.furthest_step);
        if (o.ok) continue;
        every_ok = false;
        // A node stopped by a signal to its launcher is not restarted.
        worker_failed = worker_failed && o.worker_failed;
      }
      if (every_ok) return 0;
      cause = RestartRounds::RootCause(*all);
      if (result == 0) result = 1;
    }
    if (result == 0) return 0;
    std::string stop;  // why there is no restart
    if (!worker_failed || options.max_restarts == 0) {
      stop = "";
    } else if (restart.count >= options.max_restarts) {
      stop = absl::StrCat("no restarts left (", restart.count,
                          " of --max_restarts=", options.max_restarts, " used)");
    } else if (restart.count > 0 && failed_step == previous_failed_step) {
      stop =
          absl::StrCat("failed again at ",
                       failed_step < 0 ? std::string("the same point, before any training step")
                                       : absl::StrCat("training step ", failed_step),
                       ", as before restart ", restart.count,
                       ", without progress; not restarting (restarting would fail the same way)");
    } else {
      restart.count += 1;
      restart.cause = cause;
      previous_failed_step = failed_step;
      Say(absl::StrCat("restart ", restart.count, "/", options.max_restarts, " in ",
                       absl::FormatDuration(options.restart_delay), " after ", restart.cause,
                       failed_step < 0 ? "" : absl::StrCat(", at training step ", failed_step)));
      if (const int signo = WaitForSignal(options.restart_delay); signo != 0) {
        Say(absl::StrCat("received ", strsignal(signo), " before restarting; stopping"));
        return 128 + signo;
      }
      continue;
    }
    Say(absl::StrCat("FAILED: ", cause, stop.empty() ? "" : "; ", stop));
    return result;
  }
}

absl::StatusOr<LaunchOptions> LaunchOptionsFromFlags(int experiment_world_size) {
  LaunchOptions options;
  options.nnodes = absl::GetFlag(FLAGS_nnodes);
  options.node_rank = absl::GetFlag(FLAGS_node_rank);
  options.grace_period = absl::GetFlag(FLAGS_launcher_grace_period);
  options.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  options.restart_delay = absl::GetFlag(FLAGS_restart_delay);
  options.restart_join_timeout = absl::GetFlag(FLAGS_restart_join_timeout);
  options.nproc_per_node = absl::GetFlag(FLAGS_nproc_per_node);
  if (options.nproc_per_node == 0) {
    options.nproc_per_node = 1;
    if (experiment_world_size > 0 && options.nnodes >= 1) {
      if (experiment_world_size % options.nnodes != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the experiment needs ", experiment_world_size, " ranks, which --nnodes=",
            options.nnodes, " does not divide; run a world size that is a multiple of the node ",
            "count, or set --nproc_per_node on each node"));
      }
      options.nproc_per_node = experiment_world_size / options.nnodes;
    }
  }
  // torchrun's MASTER_ADDR / MASTER_PORT from the environment, unless the
  // flags say otherwise (a flag given explicitly wins).
  options.master_addr = absl::GetFlag(FLAGS_master_addr);
  const char* env_addr = std::getenv("MASTER_ADDR");
  if (options.master_addr == "127.0.0.1" && env_addr != nullptr && *env_addr != '\0') {
    options.master_addr = env_addr;
  }
  options.run_id = absl::GetFlag(FLAGS_run_id);
  const char* env_run_id = std::getenv(kRunIdVariable);
  if (options.run_id.empty() && env_run_id != nullptr) options.run_id = env_run_id;
  if (options.run_id.empty() && options.nnodes == 1) options.run_id = RandomRunId();
  options.intra_op_threads = absl::GetFlag(FLAGS_intra_op_threads);
  options.blas_threads = absl::GetFlag(FLAGS_blas_threads);
  options.bind_cores = absl::GetFlag(FLAGS_bind_cores);
  options.master_port = absl::GetFlag(FLAGS_master_port);
  const char* env_port = std::getenv("MASTER_PORT");
  if (options.master_port == 0 && env_port != nullptr && *env_port != '\0') {
    int port = 0;
    if (!absl::SimpleAtoi(env_port, &port) || port < 1 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("MASTER_PORT='", env_port, "' in the environment must be in [1, 65535]"));
    }
    options.master_port = port;
  }
  return options;
}

WorkerRestart WorkerRestartFromEnv() {
  WorkerRestart restart;
  const char* count = std::getenv(kRestartCountVariable);
  const char* max_restarts = std::getenv(kMaxRestartsVariable);
  const char* cause = std::getenv(kRestartCauseVariable);
  if (count == nullptr || !absl::SimpleAtoi(count, &restart.count)) restart.count = 0;
  if (max_restarts == nullptr || !absl::SimpleAtoi(max_restarts, &restart.max_restarts)) {
    restart.max_restarts = 0;
  }
  if (cause != nullptr) restart.cause = cause;
  return restart;
}

std::vector<char*> MaybeLaunch(int argc, char** argv, const std::function<int()>& default_nproc) {
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  const char* rank = std::getenv("RANK");
  if (rank != nullptr && *rank != '\0') {
    ReexecWithBetterBlasKernel(argv);
    const WorkerThreads threads = ConfigureWorkerThreads();
    // Read back from the libraries, so a setting they ignored shows.
    if (std::getenv("PP_REPORT_THREADS") != nullptr) {
      const torch_compat::Blas blas = torch_compat::BlasInUse();
      const char* bound = std::getenv(kBoundCoresVariable);
      const std::string core = torch_compat::BlasCoreName();
      std::fprintf(stderr,
                   "%sthreads: %s, read back from at::get_num_threads%s; BLAS kernel %s; cores "
                   "%s (%s)\n",
                   std::string(kLauncherLineTag).c_str(), DescribeThreads(threads).c_str(),
                   blas == torch_compat::Blas::kMkl        ? " and mkl_get_max_threads"
                   : blas == torch_compat::Blas::kOpenBlas ? " and openblas_get_num_threads"
                                                           : "",
                   core.empty() ? "unknown" : core.c_str(), DescribeCores(AllowedCores()).c_str(),
                   bound != nullptr ? "bound by --bind_cores, read back" : "not bound");
    }
    return positional;
  }
  // The experiment's own checks run even when --nproc_per_node is given, so a
  // bad config is refused here rather than once per worker.
  const int experiment_world_size = default_nproc ? default_nproc() : 0;
  absl::StatusOr<LaunchOptions> options = LaunchOptionsFromFlags(experiment_world_size);
  absl::StatusOr<int> status =
      options.ok() ? RunWorkers(*options, std::vector<std::string>(argv, argv + argc))
                   : absl::StatusOr<int>(options.status());
  if (!status.ok()) {
    Say(absl::StrCat("cannot launch: ", status.status().message()));
    std::exit(2);
  }
  std::exit(*status);
}

}  // namespace pp
