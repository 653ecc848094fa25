#include "topology/blas_kernel.h"

#include <cstdlib>
#include <string>

#include "common/torch_compat_blas.h"
#include "gtest/gtest.h"

namespace pp {
namespace {

constexpr char kSkylakeCpuInfo[] =
    "processor\t: 0\n"
    "model name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl\n"
    "processor\t: 1\n"
    "model name\t: second core, not read\n";

TEST(BlasKernelTest, ParsesTheFirstProcessorsModelAndFeatures) {
  const CpuFeatures cpu = ParseCpuInfo(kSkylakeCpuInfo);
  EXPECT_EQ(cpu.model, "Intel(R) Xeon(R) Platinum 8480+");
  EXPECT_TRUE(cpu.avx2);
  EXPECT_TRUE(cpu.avx512);
  EXPECT_FALSE(cpu.avx512_bf16);
  EXPECT_EQ(BestOpenBlasCoreType(cpu), "SkylakeX");
  // AVX2 without FMA runs none of OpenBLAS's AVX2 kernels.
  EXPECT_EQ(BestOpenBlasCoreType(ParseCpuInfo("flags : sse3 avx avx2\n")), "");
  EXPECT_EQ(BestOpenBlasCoreType(ParseCpuInfo("flags : avx avx2 fma\n")), "Haswell");
  EXPECT_EQ(BestOpenBlasCoreType(
                ParseCpuInfo("flags : avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16\n")),
            "Cooperlake");
  EXPECT_EQ(ParseCpuInfo("").model, "");
}

TEST(BlasKernelTest, GenericKernelsAreTheOnesWithoutAvx) {
  for (const char* generic : {"Prescott", "prescott", "Nehalem", "Core2", "Atom"}) {
    EXPECT_TRUE(IsGenericOpenBlasCore(generic)) << generic;
  }
  for (const char* fast : {"Haswell", "SkylakeX", "Cooperlake", "Zen", "Sandybridge", ""}) {
    EXPECT_FALSE(IsGenericOpenBlasCore(fast)) << fast;
  }
}

BlasKernel Kernel(const std::string& core, const std::string& user, const char* cpuinfo) {
  return BlasKernel{.blas = "OpenBLAS 0.3.21",
                    .openblas = true,
                    .core = core,
                    .user_coretype = user,
                    .cpu = ParseCpuInfo(cpuinfo)};
}

// The forced-generic case of issue #43: the fix applies only when the user
// has not chosen the kernel, and the report says which it was.
TEST(BlasKernelTest, GenericKernelIsReplacedUnlessTheUserChoseIt) {
  BlasKernelPlan plan = PlanBlasKernel(Kernel("Prescott", "", kSkylakeCpuInfo));
  EXPECT_EQ(plan.coretype, "SkylakeX");
  EXPECT_EQ(plan.warning, "");
  EXPECT_EQ(PlanBlasKernel(Kernel("Nehalem", "", "flags : avx2 fma\n")).coretype, "Haswell");

  plan = PlanBlasKernel(Kernel("Prescott", "Prescott", kSkylakeCpuInfo));
  EXPECT_EQ(plan.coretype, "");
  EXPECT_NE(plan.warning.find("OPENBLAS_CORETYPE=Prescott is set"), std::string::npos)
      << plan.warning;
  EXPECT_NE(plan.warning.find("SkylakeX"), std::string::npos) << plan.warning;
  EXPECT_NE(DescribeBlasKernel(Kernel("Prescott", "Prescott", kSkylakeCpuInfo))
                .find("kernel Prescott (generic, forced by OPENBLAS_CORETYPE=Prescott), CPU "
                      "Intel(R) Xeon(R) Platinum 8480+ (AVX-512)"),
            std::string::npos);

  // Nothing to do: a fast kernel, a CPU without AVX2, another BLAS.
  EXPECT_EQ(PlanBlasKernel(Kernel("Haswell", "", kSkylakeCpuInfo)).coretype, "");
  EXPECT_EQ(PlanBlasKernel(Kernel("Prescott", "", "flags : sse3\n")).coretype, "");
  BlasKernel mkl = Kernel("", "", kSkylakeCpuInfo);
  mkl.openblas = false;
  EXPECT_EQ(PlanBlasKernel(mkl).coretype, "");
}

// This process: what the BLAS reports, and under CI's forced-generic run
// (OPENBLAS_CORETYPE=Prescott) the report names the kernel and who forced it.
TEST(BlasKernelTest, ThisProcessReportsItsKernel) {
  const BlasKernel kernel = ThisBlasKernel();
  EXPECT_EQ(kernel.core, torch_compat::BlasCoreName());
  EXPECT_FALSE(ThisCpu().model.empty());
  const std::string line = DescribeBlasKernel(kernel);
  EXPECT_NE(line.find(ThisCpu().model), std::string::npos) << line;
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (kernel.openblas && forced != nullptr && std::string(forced) == "Prescott") {
    EXPECT_NE(line.find("kernel Prescott (generic, forced by OPENBLAS_CORETYPE=Prescott)"),
              std::string::npos)
        << line;
    EXPECT_EQ(PlanBlasKernel(kernel).coretype, "");
  }
}

}  // namespace
}  // namespace pp
