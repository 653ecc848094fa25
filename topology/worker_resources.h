// What a worker process gets from its machine: thread counts (intra-op and
// BLAS), the cores it may run on, and glibc malloc settings. The launcher
// (topology/launcher.h) decides them per worker and passes them on in the
// environment; a worker applies them (ConfigureWorkerThreads) before it
// computes. Kept apart from the launcher, which is only torchrun's job
// (spawning, supervising, stopping workers).
//
// Threads, first that is set wins: the launcher's --intra_op_threads /
// --blas_threads; PP_INTRA_OP_THREADS / PP_BLAS_THREADS; OMP_NUM_THREADS
// (intra-op) and the BLAS's own OPENBLAS_NUM_THREADS or MKL_NUM_THREADS, else
// OMP_NUM_THREADS (BLAS, as the libraries read them); DefaultWorkerThreads().
//
// Memory: MALLOC_MMAP_THRESHOLD_=32 MiB and MALLOC_TRIM_THRESHOLD_=1 GiB
// (unless either, or GLIBC_TUNABLES, is set), so glibc keeps a step's freed
// tensors for the next step instead of page-faulting them in again.
//
// Next: topology/launcher.h (who starts the workers).
#ifndef TOPOLOGY_WORKER_RESOURCES_H_
#define TOPOLOGY_WORKER_RESOURCES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pp {

// A worker's thread counts. `blas` is -1 when the process's BLAS is neither
// OpenBLAS nor MKL (nothing to set or read back).
struct WorkerThreads {
  int intra_op = 1;
  int blas = 1;
};

// The cores the launcher bound a worker to (--bind_cores), for its report.
inline constexpr char kBoundCoresVariable[] = "PP_BOUND_CORES";

// glibc's largest mmap threshold on 64-bit (32 MiB), and a trim threshold
// (1 GiB) that keeps a step's freed memory for the next one.
inline constexpr int64_t kWorkerMmapThreshold = int64_t{32} << 20;
inline constexpr int64_t kWorkerTrimThreshold = int64_t{1} << 30;

// The cores (CPU numbers) that worker `local` of `nproc` gets under
// --bind_cores, from `allowed` (the launcher's own affinity, ascending): with
// as many workers as cores or more, one core each, round-robin (worker k on
// allowed[k % cores], so 4 workers on 2 cores pair 0 with 2 and 1 with 3);
// with fewer, a contiguous block of allowed[local * cores / nproc ..
// (local + 1) * cores / nproc). Empty when `allowed` is.
std::vector<int> CoresForWorker(const std::vector<int>& allowed, int local, int nproc);

// The cores this process may run on (sched_getaffinity), ascending.
std::vector<int> AllowedCores();

// "0-3,6" for {0, 1, 2, 3, 6}; "none" when empty.
std::string DescribeCores(const std::vector<int>& cores);

// The per-process thread count when `local_world_size` ranks share this
// machine: max(1, cores this process may run on / local_world_size).
int WorkerThreadCount(int local_world_size);

// The most threads of either kind a worker may be asked for: 4 per core this
// process may run on, at least 8. More only oversubscribes the cores (4096
// intra-op threads per worker never reached a step).
int MaxWorkerThreads();

// The default split for `local_world_size` ranks on this machine: one
// intra-op thread, WorkerThreadCount() BLAS threads. Measured on the 2-core
// machine with the peer GPT (docs/performance.md): pp = 1 with 1 + 2 is the
// fastest split (2 + 2, the old default, oversubscribes the cores: each
// intra-op thread calls a GEMM that starts 2 BLAS threads); pp = 2 takes 1 + 1.
WorkerThreads DefaultWorkerThreads(int local_world_size);

// What a worker with `local_world_size` local ranks will use, from `flags`
// (0 = unset) and the environment (see the file comment). InvalidArgument
// naming the variable (or the flag, --intra_op_threads / --blas_threads) when
// one is set but is not a positive integer or is above MaxWorkerThreads().
absl::StatusOr<WorkerThreads> ResolveWorkerThreads(int local_world_size, WorkerThreads flags);

// Sets both counts now (at::set_num_threads, then the BLAS's: with MKL the
// order matters, at::set_num_threads sets MKL's count too) and returns what the
// libraries report back.
WorkerThreads SetWorkerThreads(WorkerThreads threads);

// What this process uses now: at::get_num_threads() and the BLAS's read-back
// (torch_compat::BlasThreads(); -1 when the BLAS is unknown).
WorkerThreads CurrentWorkerThreads();

// "1 intra-op + 2 BLAS thread(s) (MKL)" or "... (OpenBLAS)" (or "1 intra-op
// thread(s), BLAS threads unknown ..." when blas is -1).
std::string DescribeThreads(WorkerThreads threads);

// Resolves (ResolveWorkerThreads with LOCAL_WORLD_SIZE from the environment, 1
// if unset; an invalid setting falls back to the default with a warning on
// stderr) and sets the counts; returns what the libraries report back.
WorkerThreads ConfigureWorkerThreads();

// Sets the BLAS's own thread count now (torch_compat::SetBlasThreads). The
// libraries read their variables only when they load, so a process that
// changes its mind later (a benchmark comparing thread counts) must call this.
// Returns false when the process's BLAS is neither OpenBLAS nor MKL.
bool SetBlasThreads(int threads);

// The variables that give a worker `threads` (OMP_NUM_THREADS and the BLAS's
// own too, so the libraries size their pools right when they load) and ask
// it to report what it uses (PP_REPORT_THREADS).
std::vector<std::pair<std::string, std::string>> WorkerThreadVariables(WorkerThreads threads);

// MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ for a worker; none when
// this process's environment sets either, or GLIBC_TUNABLES.
std::vector<std::pair<std::string, std::string>> WorkerMallocVariables();

}  // namespace pp

#endif  // TOPOLOGY_WORKER_RESOURCES_H_
