#include "topology/blas_kernel.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/torch_compat_blas.h"

namespace pp {

CpuFeatures ParseCpuInfo(absl::string_view cpuinfo) {
  CpuFeatures cpu;
  bool model_seen = false, flags_seen = false;
  for (absl::string_view line : absl::StrSplit(cpuinfo, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view key = absl::StripAsciiWhitespace(line.substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (key == "model name" && !model_seen) {
      cpu.model = std::string(value);
      model_seen = true;
    } else if (key == "flags" && !flags_seen) {
      flags_seen = true;
      const std::vector<absl::string_view> flags = absl::StrSplit(value, ' ', absl::SkipEmpty());
      auto has = [&](absl::string_view flag) {
        for (absl::string_view f : flags) {
          if (f == flag) return true;
        }
        return false;
      };
      cpu.avx2 = has("avx2") && has("fma");
      cpu.avx512 =
          cpu.avx2 && has("avx512f") && has("avx512bw") && has("avx512dq") && has("avx512vl");
      cpu.avx512_bf16 = cpu.avx512 && has("avx512_bf16");
    }
    if (model_seen && flags_seen) break;
  }
  return cpu;
}

const CpuFeatures& ThisCpu() {
  static const CpuFeatures* const cpu = [] {
    std::ifstream in("/proc/cpuinfo");
    std::stringstream text;
    text << in.rdbuf();
    return new CpuFeatures(ParseCpuInfo(text.str()));
  }();
  return *cpu;
}

bool IsGenericOpenBlasCore(absl::string_view core) {
  // OpenBLAS's x86-64 kernels that use no AVX (its dynamic.c names).
  for (const char* generic : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                              "Nano", "Opteron", "Opteron_SSE3", "Barcelona", "Bobcat", "Katmai",
                              "Coppermine", "Northwood", "Banias", "Athlon", "Unknown"}) {
    if (absl::EqualsIgnoreCase(core, generic)) return true;
  }
  return false;
}

std::string BestOpenBlasCoreType(const CpuFeatures& cpu) {
  if (cpu.avx512_bf16) return "Cooperlake";
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2) return "Haswell";
  return "";
}

BlasKernel ThisBlasKernel() {
  BlasKernel kernel;
  kernel.blas = torch_compat::BlasDescription();
  kernel.openblas = torch_compat::BlasInUse() == torch_compat::Blas::kOpenBlas;
  kernel.core = torch_compat::BlasCoreName();
  const char* user = std::getenv(kOpenBlasCoreTypeVariable);
  kernel.user_coretype = user == nullptr ? "" : user;
  kernel.cpu = ThisCpu();
  return kernel;
}

BlasKernelPlan PlanBlasKernel(const BlasKernel& kernel) {
  BlasKernelPlan plan;
  if (!kernel.openblas || !IsGenericOpenBlasCore(kernel.core)) return plan;
  const std::string best = BestOpenBlasCoreType(kernel.cpu);
  if (best.empty()) return plan;
  if (!kernel.user_coretype.empty()) {
    plan.warning = absl::StrCat("OpenBLAS runs its generic ", kernel.core, " kernel because ",
                                kOpenBlasCoreTypeVariable, "=", kernel.user_coretype,
                                " is set, on a CPU (", kernel.cpu.model, ") that runs its faster ",
                                best, " kernel; kept, as it is your setting (unset it or set ",
                                kOpenBlasCoreTypeVariable, "=", best, " for the fast one)");
    return plan;
  }
  plan.coretype = best;
  return plan;
}

std::string DescribeBlasKernel(const BlasKernel& kernel) {
  const CpuFeatures& cpu = kernel.cpu;
  std::string line = absl::StrCat("BLAS ", kernel.blas, ", kernel ",
                                  kernel.core.empty() ? "unknown" : kernel.core);
  if (kernel.openblas && IsGenericOpenBlasCore(kernel.core)) {
    absl::StrAppend(&line, " (generic");
    if (!kernel.user_coretype.empty()) {
      absl::StrAppend(&line, ", forced by ", kOpenBlasCoreTypeVariable, "=", kernel.user_coretype);
    }
    absl::StrAppend(&line, ")");
  } else if (kernel.openblas && !kernel.user_coretype.empty()) {
    absl::StrAppend(&line, " (", kOpenBlasCoreTypeVariable, "=", kernel.user_coretype, ")");
  }
  absl::StrAppend(&line, ", CPU ", cpu.model.empty() ? "unknown" : cpu.model, " (",
                  cpu.avx512_bf16 ? "AVX-512 BF16"
                  : cpu.avx512    ? "AVX-512"
                  : cpu.avx2      ? "AVX2"
                                  : "no AVX2",
                  ")");
  return line;
}

}  // namespace pp
