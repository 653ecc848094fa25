#include "topology/worker_resources.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <thread>
#include <utility>

#include <ATen/Parallel.h>
#include <glog/logging.h>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/torch_compat_blas.h"

namespace pp {
namespace {

int CpuCount() {
  const std::vector<int> allowed = AllowedCores();
  if (!allowed.empty()) return static_cast<int>(allowed.size());
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

std::vector<int> CoresForWorker(const std::vector<int>& allowed, int local, int nproc) {
  const int cores = static_cast<int>(allowed.size());
  if (cores == 0 || nproc < 1 || local < 0 || local >= nproc) return {};
  if (nproc >= cores) return {allowed[local % cores]};
  return std::vector<int>(allowed.begin() + local * cores / nproc,
                          allowed.begin() + (local + 1) * cores / nproc);
}

std::vector<int> AllowedCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cores;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cores.push_back(cpu);
  }
  return cores;
}

std::string DescribeCores(const std::vector<int>& cores) {
  if (cores.empty()) return "none";
  std::string out;
  for (size_t i = 0; i < cores.size();) {
    size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    absl::StrAppend(&out, out.empty() ? "" : ",", cores[i]);
    if (j > i) absl::StrAppend(&out, "-", cores[j]);
    i = j + 1;
  }
  return out;
}

int WorkerThreadCount(int local_world_size) {
  return std::max(1, CpuCount() / std::max(1, local_world_size));
}

int MaxWorkerThreads() { return std::max(8, 4 * CpuCount()); }

WorkerThreads DefaultWorkerThreads(int local_world_size) {
  return WorkerThreads{.intra_op = 1, .blas = WorkerThreadCount(local_world_size)};
}

namespace {

// The first of `names` set in the environment, parsed; 0 when none is set.
absl::StatusOr<int> ThreadsFromEnv(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    int threads = 0;
    if (!absl::SimpleAtoi(value, &threads) || threads < 1 || threads > MaxWorkerThreads()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "='", value,
                       "' is not a thread count for this machine; valid: an integer >= 1 and <= ",
                       MaxWorkerThreads(), " (4 per core of the ", CpuCount(),
                       " this process may run on), or unset for the default"));
    }
    return threads;
  }
  return 0;
}

}  // namespace

absl::StatusOr<WorkerThreads> ResolveWorkerThreads(int local_world_size, WorkerThreads flags) {
  for (const auto& [flag, value] :
       {std::pair{"--intra_op_threads", flags.intra_op}, std::pair{"--blas_threads", flags.blas}}) {
    if (value > MaxWorkerThreads()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, "=", value, " is more threads than this machine can run; valid: 0 (automatic) to ",
          MaxWorkerThreads(), " (4 per core of the ", CpuCount(), " this process may run on)"));
    }
  }
  WorkerThreads threads = DefaultWorkerThreads(local_world_size);
  PP_ASSIGN_OR_RETURN(const int intra_env,
                      ThreadsFromEnv({"PP_INTRA_OP_THREADS", "OMP_NUM_THREADS"}));
  // The BLAS's own variable: OpenBLAS ignores MKL_NUM_THREADS and MKL ignores
  // OPENBLAS_NUM_THREADS, so only the one of the BLAS in use counts.
  const char* blas_variable = torch_compat::BlasThreadsVariable(torch_compat::BlasInUse());
  PP_ASSIGN_OR_RETURN(const int blas_env,
                      blas_variable == nullptr
                          ? ThreadsFromEnv({"PP_BLAS_THREADS", "OMP_NUM_THREADS"})
                          : ThreadsFromEnv({"PP_BLAS_THREADS", blas_variable, "OMP_NUM_THREADS"}));
  if (intra_env > 0) threads.intra_op = intra_env;
  if (blas_env > 0) threads.blas = blas_env;
  if (flags.intra_op > 0) threads.intra_op = flags.intra_op;
  if (flags.blas > 0) threads.blas = flags.blas;
  return threads;
}

WorkerThreads SetWorkerThreads(WorkerThreads threads) {
  at::set_num_threads(threads.intra_op);
  SetBlasThreads(threads.blas);
  return CurrentWorkerThreads();
}

WorkerThreads CurrentWorkerThreads() {
  return WorkerThreads{.intra_op = at::get_num_threads(), .blas = torch_compat::BlasThreads()};
}

std::string DescribeThreads(WorkerThreads threads) {
  const torch_compat::Blas blas = torch_compat::BlasInUse();
  if (threads.blas < 0 || blas == torch_compat::Blas::kUnknown) {
    return absl::StrCat(threads.intra_op,
                        " intra-op thread(s), BLAS threads unknown (neither OpenBLAS nor MKL)");
  }
  return absl::StrCat(threads.intra_op, " intra-op + ", threads.blas, " BLAS thread(s) (",
                      torch_compat::BlasName(blas), ")");
}

WorkerThreads ConfigureWorkerThreads() {
  int local_world_size = 1;
  const char* lws = std::getenv("LOCAL_WORLD_SIZE");
  if (lws == nullptr || !absl::SimpleAtoi(lws, &local_world_size) || local_world_size < 1) {
    local_world_size = 1;
  }
  absl::StatusOr<WorkerThreads> threads = ResolveWorkerThreads(local_world_size, {0, 0});
  if (!threads.ok()) {
    LOG(WARNING) << threads.status().message() << "; using the default threads";
    threads = DefaultWorkerThreads(local_world_size);
  }
  return SetWorkerThreads(*threads);
}

bool SetBlasThreads(int threads) { return torch_compat::SetBlasThreads(threads); }

std::vector<std::pair<std::string, std::string>> WorkerThreadVariables(WorkerThreads threads) {
  std::vector<std::pair<std::string, std::string>> vars;
  for (const char* key : {"OMP_NUM_THREADS", "PP_INTRA_OP_THREADS"}) {
    vars.emplace_back(key, std::to_string(threads.intra_op));
  }
  vars.emplace_back("PP_BLAS_THREADS", std::to_string(threads.blas));
  if (const char* blas_variable = torch_compat::BlasThreadsVariable(torch_compat::BlasInUse())) {
    vars.emplace_back(blas_variable, std::to_string(threads.blas));
  }
  vars.emplace_back("PP_REPORT_THREADS", "1");
  return vars;
}

std::vector<std::pair<std::string, std::string>> WorkerMallocVariables() {
  std::vector<std::pair<std::string, std::string>> vars;
  // glibc's malloc gives each freed block above its dynamic mmap threshold
  // (128 KiB at first) back to the kernel and trims the heap top above 2x of
  // it, so a training step's activation-sized tensors are page-faulted in
  // afresh every step (~35k faults, ~2-3% of a step's CPU time on the peer GPT,
  // issue #16). Both are set or neither: setting only the trim threshold turns
  // the dynamic mmap threshold off and every large block is mmapped (60x more
  // faults). A person's own settings (either variable, or GLIBC_TUNABLES) win.
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr &&
      std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr &&
      std::getenv("GLIBC_TUNABLES") == nullptr) {
    vars.emplace_back("MALLOC_MMAP_THRESHOLD_", std::to_string(kWorkerMmapThreshold));
    vars.emplace_back("MALLOC_TRIM_THRESHOLD_", std::to_string(kWorkerTrimThreshold));
  }
  return vars;
}

}  // namespace pp
