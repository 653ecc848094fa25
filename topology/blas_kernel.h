// Which BLAS kernel LibTorch's matrix products run on, and the fix when it is
// a generic one on a CPU that can do better.
//
// Debian's OpenBLAS is built with DYNAMIC_ARCH: at load time it picks a kernel
// for the CPU it finds, and on CPUs it does not know (newer Intel models in
// some VMs, issue #42) it falls back to its generic Prescott (SSE3) kernels,
// several times slower than Haswell's (AVX2) or SkylakeX's (AVX-512), with
// other rounding. OPENBLAS_CORETYPE, read once when the library loads, forces
// a kernel. So the launcher (topology/launcher.h) starts its workers with the
// kernel the CPU supports when OpenBLAS picked a generic one, and a worker
// another launcher started (torchrun) re-executes itself with it. A user's own
// OPENBLAS_CORETYPE is never overridden: the report says what it costs.
//
// Thread-safety: every function may be called from any thread.
#ifndef TOPOLOGY_BLAS_KERNEL_H_
#define TOPOLOGY_BLAS_KERNEL_H_

#include <string>
#include "absl/strings/string_view.h"

namespace pp {

inline constexpr char kOpenBlasCoreTypeVariable[] = "OPENBLAS_CORETYPE";

// What the CPU offers that OpenBLAS's kernels use.
struct CpuFeatures {
  std::string model;         // /proc/cpuinfo's "model name"; "" when unknown
  bool avx2 = false;         // with FMA: OpenBLAS's Haswell kernels need both
  bool avx512 = false;       // avx512f, bw, dq and vl: SkylakeX's kernels
  bool avx512_bf16 = false;  // Cooperlake's
};

// The features of the first processor in a /proc/cpuinfo text.
CpuFeatures ParseCpuInfo(absl::string_view cpuinfo);

// This machine's (read once).
const CpuFeatures& ThisCpu();

// True for OpenBLAS's kernels of CPUs without AVX (Prescott, Core2, Penryn,
// Dunnington, Nehalem, Atom, ...): what it falls back to on a CPU it does not
// know. Case-insensitive.
bool IsGenericOpenBlasCore(absl::string_view core);

// The best OpenBLAS kernel `cpu` runs: "Cooperlake", "SkylakeX", "Haswell", or
// "" when it has no AVX2.
std::string BestOpenBlasCoreType(const CpuFeatures& cpu);

// The BLAS a process runs and what chose its kernel.
struct BlasKernel {
  std::string blas;           // "OpenBLAS 0.3.21 DYNAMIC_ARCH ...", "MKL", ...
  bool openblas = false;      // whether `core` and OPENBLAS_CORETYPE apply
  std::string core;           // the kernel in use ("Prescott"); "" when unknown
  std::string user_coretype;  // OPENBLAS_CORETYPE as set when it loaded; "" unset
  CpuFeatures cpu;
};

// This process's (torch_compat::BlasDescription, BlasCoreName, the
// environment, ThisCpu()).
BlasKernel ThisBlasKernel();

// What to do about `kernel`: the OPENBLAS_CORETYPE value to start workers with
// ("" for none: not OpenBLAS, not generic, no better kernel on this CPU, or
// the user set one), and a warning to print ("" when there is nothing to say).
struct BlasKernelPlan {
  std::string coretype;
  std::string warning;
};
BlasKernelPlan PlanBlasKernel(const BlasKernel& kernel);

// One line for reports: "BLAS OpenBLAS 0.3.21 ..., kernel Haswell, CPU AMD EPYC
// (AVX2)"; with a generic kernel it says so, and who set it.
std::string DescribeBlasKernel(const BlasKernel& kernel);

}  // namespace pp

#endif  // TOPOLOGY_BLAS_KERNEL_H_
