// The BLAS that LibTorch's CPU matrix products run on, and its thread count:
// the part of the LibTorch differences (common/torch_compat.h) that the
// launcher needs, in a target of its own so that the few binaries that set
// threads are all that depend on it.
//
// Debian's LibTorch 1.13 calls the system OpenBLAS, whose one process-wide pool
// is set by openblas_set_num_threads. The PyTorch wheel's libtorch_cpu (2.x,
// --config=torch2 / --config=cuda) has MKL linked in: at::set_num_threads also
// sets MKL's count for the calling thread, and the wheel exports only part of
// MKL's thread API (mkl_get_max_threads and MKL_Set_Num_Threads_Local, not
// mkl_set_num_threads). Neither library is a link-time dependency of pipe;
// their functions are found by name at run time, so nothing here depends on
// the LibTorch version at compile time.
//
// Thread-safety: every function may be called from any thread.
#ifndef COMMON_TORCH_COMPAT_BLAS_H_
#define COMMON_TORCH_COMPAT_BLAS_H_

#include <string>

namespace pp::torch_compat {

// MKL when LibTorch was built with it (at::hasMKL()) and its thread functions
// are loaded; else OpenBLAS when its thread functions are loaded; else unknown.
enum class Blas { kUnknown, kOpenBlas, kMkl };
Blas BlasInUse();

// "OpenBLAS", "MKL", "unknown BLAS": for messages.
const char* BlasName(Blas blas);

// The environment variable `blas` reads its thread count from when it loads
// (OPENBLAS_NUM_THREADS, MKL_NUM_THREADS); nullptr for kUnknown.
const char* BlasThreadsVariable(Blas blas);

// Sets the thread count of BlasInUse() now; returns false (and sets nothing)
// when it is unknown. OpenBLAS: its process-wide pool. MKL: the calling
// thread's count (what at::set_num_threads set there) and MKL's process-wide
// default for threads that have set none (MKL caps that one at the machine's
// cores). A later at::set_num_threads(n) on the same thread sets MKL's count to
// n again, so call this after it. REQUIRES: threads >= 1.
bool SetBlasThreads(int threads);

// The thread count the BLAS itself reports for a product started on the
// calling thread (openblas_get_num_threads, mkl_get_max_threads); -1 when the
// BLAS is unknown.
int BlasThreads();

// The kernel the BLAS picked for this CPU when it loaded: OpenBLAS's
// openblas_get_corename ("Haswell", "SkylakeX", "Prescott" for its generic
// x86-64 kernels, ...), which OPENBLAS_CORETYPE overrides at load time. Empty
// when the BLAS is not OpenBLAS or does not say (MKL picks per call).
std::string BlasCoreName();

// The BLAS's own build description (openblas_get_config: "OpenBLAS 0.3.21
// DYNAMIC_ARCH ..."), else BlasName(BlasInUse()).
std::string BlasDescription();

}  // namespace pp::torch_compat

#endif  // COMMON_TORCH_COMPAT_BLAS_H_
