#include "common/torch_compat.h"

#include <dlfcn.h>

#include <cstdlib>
#include <initializer_list>
#include <mutex>

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <c10/util/string_utils.h>
#include <torch/version.h>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace pp::torch_compat {

std::string LibTorchVersion() { return TORCH_VERSION; }

int LibTorchMajorVersion() { return TORCH_VERSION_MAJOR; }

bool BuiltWithCuda() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> NewGlooProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& options) {
#if TORCH_VERSION_MAJOR >= 2
  // c10d's flight recorder (2.x) is one process-wide buffer that Gloo groups
  // write to without a lock that covers several groups used from several
  // threads: equivalence_test (ranks as threads) segfaulted in
  // FlightRecorder::recordWithResetEnabled. It is read once, at first use, from
  // TORCH_FR_BUFFER_SIZE; off unless the user set it.
  static std::once_flag flight_recorder_off;
  std::call_once(flight_recorder_off, [] { setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0); });
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
#else
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
#endif
}

void AddNcclBackend(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout) {
#if TORCH_VERSION_MAJOR >= 2 && defined(USE_C10D_NCCL)
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, backend);
#else
  (void)group;
  (void)store;
  (void)rank;
  (void)size;
  (void)timeout;
  TORCH_CHECK(false, "c10d's NCCL backend is not in this build (LibTorch ", TORCH_VERSION,
              BuiltWithCuda() ? "" : ", CPU only",
              "); build with --config=cuda (LibTorch 2.x with CUDA and NCCL)");
#endif
}

namespace {

// The thread functions of the BLAS in use, looked up once. Neither library is a
// link-time dependency of pipe: OpenBLAS comes with Debian's LibTorch, MKL is
// inside the wheel's libtorch_cpu, so both are found by name at run time.
struct BlasFunctions {
  Blas blas = Blas::kUnknown;
  int (*get_threads)() = nullptr;
  void (*set_threads)(int) = nullptr;       // OpenBLAS's pool; MKL's global default
  int (*set_threads_local)(int) = nullptr;  // MKL only: the calling thread's count
};

template <typename Fn>
Fn Lookup(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (void* symbol = dlsym(RTLD_DEFAULT, name)) return reinterpret_cast<Fn>(symbol);
  }
  return nullptr;
}

BlasFunctions FindBlas() {
  BlasFunctions f;
  if (at::hasMKL()) {
    // The wheel exports MKL's C names for what LibTorch itself calls
    // (mkl_get_max_threads, MKL_Set_Num_Threads_Local), not mkl_set_num_threads:
    // its global setter is found under MKL's service name, which the public
    // MKL_Set_Num_Threads forwards to.
    f.get_threads = Lookup<int (*)()>({"mkl_get_max_threads", "MKL_Get_Max_Threads"});
    f.set_threads_local =
        Lookup<int (*)(int)>({"MKL_Set_Num_Threads_Local", "mkl_set_num_threads_local"});
    f.set_threads = Lookup<void (*)(int)>(
        {"MKL_Set_Num_Threads", "mkl_set_num_threads", "mkl_serv_set_num_threads"});
    if (f.get_threads != nullptr && f.set_threads_local != nullptr) f.blas = Blas::kMkl;
    return f;
  }
  f.get_threads = Lookup<int (*)()>({"openblas_get_num_threads"});
  f.set_threads = Lookup<void (*)(int)>({"openblas_set_num_threads"});
  if (f.get_threads != nullptr && f.set_threads != nullptr) f.blas = Blas::kOpenBlas;
  return f;
}

const BlasFunctions& Functions() {
  static const BlasFunctions* const functions = new BlasFunctions(FindBlas());
  return *functions;
}

}  // namespace

Blas BlasInUse() { return Functions().blas; }

const char* BlasName(Blas blas) {
  switch (blas) {
    case Blas::kOpenBlas:
      return "OpenBLAS";
    case Blas::kMkl:
      return "MKL";
    case Blas::kUnknown:
      break;
  }
  return "unknown BLAS";
}

const char* BlasThreadsVariable(Blas blas) {
  switch (blas) {
    case Blas::kOpenBlas:
      return "OPENBLAS_NUM_THREADS";
    case Blas::kMkl:
      return "MKL_NUM_THREADS";
    case Blas::kUnknown:
      break;
  }
  return nullptr;
}

bool SetBlasThreads(int threads) {
  const BlasFunctions& f = Functions();
  switch (f.blas) {
    case Blas::kOpenBlas:
      f.set_threads(threads);
      return true;
    case Blas::kMkl:
      if (f.set_threads != nullptr) f.set_threads(threads);
      f.set_threads_local(threads);
      return true;
    case Blas::kUnknown:
      break;
  }
  return false;
}

int BlasThreads() {
  const BlasFunctions& f = Functions();
  return f.blas == Blas::kUnknown ? -1 : f.get_threads();
}

OptimizerStateKey OptimizerStateKeyOf(const at::Tensor& param) {
#if TORCH_VERSION_MAJOR >= 2
  return param.unsafeGetTensorImpl();
#else
  return c10::guts::to_string(param.unsafeGetTensorImpl());
#endif
}

}  // namespace pp::torch_compat
