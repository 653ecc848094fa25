#include "common/torch_compat_blas.h"

#include <dlfcn.h>

#include <initializer_list>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

namespace pp::torch_compat {
namespace {

// The thread functions of the BLAS in use, looked up once.
struct BlasFunctions {
  Blas blas = Blas::kUnknown;
  int (*get_threads)() = nullptr;
  void (*set_threads)(int) = nullptr;       // OpenBLAS's pool; MKL's global default
  int (*set_threads_local)(int) = nullptr;  // MKL only: the calling thread's count
  char* (*core_name)() = nullptr;           // OpenBLAS only
  char* (*config)() = nullptr;              // OpenBLAS only
};

// The first of `names` that the loaded libraries define, as a `Fn`.
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
    // The wheel's MKL exports the C names of what LibTorch itself calls; its
    // global setter is found under MKL's service name, to which the public
    // MKL_Set_Num_Threads (not exported there) forwards, as the exported
    // MKL_Set_Num_Threads_Local forwards to mkl_serv_set_num_threads_local.
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
  f.core_name = Lookup<char* (*)()>({"openblas_get_corename"});
  f.config = Lookup<char* (*)()>({"openblas_get_config"});
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
      // LibTorch sets MKL's count on a thread to the intra-op count the first
      // time that thread asks for or uses intra-op threads (its lazy
      // per-thread init, run by at::get_num_threads and parallel_for): run it
      // now, or it undoes this at the first read-back.
      at::get_num_threads();
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

std::string BlasCoreName() {
  const BlasFunctions& f = Functions();
  if (f.blas != Blas::kOpenBlas || f.core_name == nullptr) return "";
  const char* name = f.core_name();
  return name == nullptr ? "" : name;
}

std::string BlasDescription() {
  const BlasFunctions& f = Functions();
  if (f.blas == Blas::kOpenBlas && f.config != nullptr) {
    if (const char* config = f.config(); config != nullptr && *config != '\0') return config;
  }
  return BlasName(f.blas);
}

}  // namespace pp::torch_compat
