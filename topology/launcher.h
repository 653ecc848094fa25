// The launcher every experiment binary carries (torchrun built in).
//
// Run without RANK in its environment, a binary that calls MaybeLaunch first
// becomes its own launcher: it starts --nproc_per_node copies of itself
// (/proc/self/exe, same arguments) with torchrun's variables set, prefixes each
// line they print with "[rank N] ", and exits with their status. If a worker
// exits non-zero or is killed, the others get SIGTERM, then SIGKILL after a
// grace period, and the launcher exits non-zero naming the rank and how it
// ended. Ctrl-C (SIGINT/SIGTERM to the launcher) stops every worker. In a worker
// (RANK set) MaybeLaunch splits the machine's cores among the local ranks and
// returns.
//
// Worker resources (topology/worker_resources.h, its own target): each worker
// gets an intra-op thread count (at::set_num_threads) and
// a BLAS thread count set separately: OpenBLAS's own pool with Debian's
// LibTorch, MKL's count with the PyTorch wheel's (torch_compat::BlasInUse).
// Resolution, first that is set wins: --intra_op_threads / --blas_threads;
// PP_INTRA_OP_THREADS / PP_BLAS_THREADS in the launcher's environment (what an
// experiment config's `threads` section exports); OMP_NUM_THREADS (intra-op)
// and the BLAS's own OPENBLAS_NUM_THREADS or MKL_NUM_THREADS, else
// OMP_NUM_THREADS (BLAS, as the libraries read them); DefaultWorkerThreads(). A
// launched worker prints what it really uses, read back from
// at::get_num_threads() and the BLAS (openblas_get_num_threads,
// mkl_get_max_threads), and which BLAS it is.
//
// Memory: workers get MALLOC_MMAP_THRESHOLD_=32 MiB and MALLOC_TRIM_THRESHOLD_=
// 1 GiB (unless either, or GLIBC_TUNABLES, is set), so glibc keeps a step's
// freed tensors for the next step instead of page-faulting them in again.
//
//   int main(int argc, char** argv) {
//     std::vector<char*> args = pp::MaybeLaunch(argc, argv);  // parent exits here
//     PP_ASSIGN_OR_RETURN... pp::RendezvousFromEnv(...)
//   }
//
// Restarts (torchrun's --max_restarts): when a worker fails and restarts are
// left, the launcher stops the others as above, waits --restart_delay and
// starts every worker again, telling them the restart's count and cause
// (torchrun's TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS, and
// PP_RESTART_CAUSE: WorkerRestartFromEnv);
// a training driver resumes from its newest checkpoint that verifies. An
// attempt that fails at the same training step as the one before (the
// furthest step any worker reported, launcher_status.h) is not restarted.
// With several nodes every node's launcher restarts with the others, round
// by round, through a store node 0's launcher hosts on --master_port + 1
// (topology/restart_rounds.h): a failure on one node stops the workers of
// all, and a node that does not come back within --restart_join_timeout ends
// the run, named.
//
// Flags (absl, defined here so every experiment has them): --nproc_per_node,
// --nnodes, --node_rank, --master_addr, --master_port, --launcher_grace_period,
// --max_restarts, --restart_delay, --restart_join_timeout, --intra_op_threads,
// --blas_threads.
//
// Next: topology/rendezvous.h (what a worker does with the environment).
#ifndef TOPOLOGY_LAUNCHER_H_
#define TOPOLOGY_LAUNCHER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
// Worker threads, cores and malloc settings moved to their own target; kept
// here for the launcher's existing callers.
#include "topology/worker_resources.h"  // IWYU pragma: export

ABSL_DECLARE_FLAG(int, nproc_per_node);
ABSL_DECLARE_FLAG(int, nnodes);
ABSL_DECLARE_FLAG(int, node_rank);
ABSL_DECLARE_FLAG(std::string, master_addr);
ABSL_DECLARE_FLAG(int, master_port);
ABSL_DECLARE_FLAG(std::string, run_id);
ABSL_DECLARE_FLAG(absl::Duration, launcher_grace_period);
ABSL_DECLARE_FLAG(int, max_restarts);
ABSL_DECLARE_FLAG(absl::Duration, restart_delay);
ABSL_DECLARE_FLAG(absl::Duration, restart_join_timeout);
ABSL_DECLARE_FLAG(int, intra_op_threads);
ABSL_DECLARE_FLAG(int, blas_threads);
ABSL_DECLARE_FLAG(bool, bind_cores);

namespace pp {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  // 0: pick a free port (single node only; several nodes must agree on one).
  int master_port = 0;
  // PP_RUN_ID for the workers (topology/rendezvous.h); empty: none.
  std::string run_id;
  // Between SIGTERM and SIGKILL when stopping workers.
  absl::Duration grace_period = absl::Seconds(5);
  // Times every worker is started again after one failed (0: never).
  int max_restarts = 0;
  // Between stopping a failed attempt's workers and starting the next.
  absl::Duration restart_delay = absl::Seconds(1);
  // Several nodes with restarts: the longest wait for the other nodes'
  // launchers to join a round or report its end (restart_rounds.h).
  absl::Duration restart_join_timeout = absl::Minutes(5);
  // Per worker; 0: from the environment, else DefaultWorkerThreads().
  int intra_op_threads = 0;
  int blas_threads = 0;
  // Binds each worker to its own cores (CoresForWorker over the cores the
  // launcher may run on) before it starts: DeepSpeed's --bind_cores_to_rank.
  bool bind_cores = false;
};

// What a worker's environment says about the attempt it belongs to (the
// first two are torchrun's names).
inline constexpr char kRestartCountVariable[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kMaxRestartsVariable[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kRestartCauseVariable[] = "PP_RESTART_CAUSE";
struct WorkerRestart {
  // 0: the first attempt; k: the k-th restart.
  int count = 0;
  int max_restarts = 0;
  // How the previous attempt failed ("rank 1 (pid 42) was killed by signal
  // 9 (Killed)"); empty on the first attempt.
  std::string cause;
};
// In a launched worker; the first attempt's (all zero) elsewhere.
WorkerRestart WorkerRestartFromEnv();

// Validates `options` (InvalidArgument naming the bad value), starts the
// workers running `argv` (argv[0] is replaced by /proc/self/exe), forwards
// their output with "[rank N] " prefixes and waits. Returns the exit status the
// launcher should exit with: 0 when every worker exited 0; otherwise non-zero,
// after logging which rank failed first and how (exit code or signal). A
// worker's failure restarts every worker, up to options.max_restarts times,
// unless the attempt failed at the same training step as the previous one.
absl::StatusOr<int> RunWorkers(const LaunchOptions& options, const std::vector<std::string>& argv);

// The launcher's options from its flags. `experiment_world_size` (<= 0: none)
// is the experiment's total rank count: --nproc_per_node left at 0 becomes
// experiment_world_size / --nnodes (an error naming both when it does not
// divide), or 1 without one. MASTER_ADDR / MASTER_PORT in the environment
// (torchrun's variables) are used when --master_addr / --master_port are left
// at their defaults; a MASTER_PORT that is not a port is an error naming it.
absl::StatusOr<LaunchOptions> LaunchOptionsFromFlags(int experiment_world_size);

// Parses absl flags (absl::ParseCommandLine) and returns the positional
// arguments. When RANK is unset: runs the workers with options from the flags
// and exits the process with their status (never returns; exit 2 when the
// options are invalid). `default_nproc`, if given, is called in the launcher
// before any worker starts, whatever --nproc_per_node says (after flags are
// parsed, so it may read the experiment's own flags): it is where an
// experiment checks its config and may exit (status 2) before anything is
// spawned. It returns the experiment's world size (e.g. pp x dp), which sets
// --nproc_per_node when the flag is left at 0 (see LaunchOptionsFromFlags)
// and is ignored when the flag is given. When RANK is set (a worker): calls
// ConfigureWorkerThreads() and returns; `default_nproc` is not called.
std::vector<char*> MaybeLaunch(int argc, char** argv,
                               const std::function<int()>& default_nproc = nullptr);

}  // namespace pp

#endif  // TOPOLOGY_LAUNCHER_H_
