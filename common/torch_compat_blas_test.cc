#include "common/torch_compat_blas.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include "gtest/gtest.h"

namespace pp::torch_compat {
namespace {

// The setter must reach the BLAS: the read-back is the library's own, on this
// thread and on a thread started afterwards, for counts that each differ from
// the one before (a no-op setter leaves the count where it was). MKL's
// process-wide default, which a new thread reads, is capped at the machine's
// cores; a thread's own count is not.
TEST(TorchCompatBlasTest, BlasThreadsAreSetAndReadBack) {
  const Blas blas = BlasInUse();
  ASSERT_EQ(blas, at::hasMKL() ? Blas::kMkl : Blas::kOpenBlas) << BlasName(blas);
  ASSERT_NE(BlasThreadsVariable(blas), nullptr);
  const int intra_before = at::get_num_threads();
  const int blas_before = BlasThreads();
  ASSERT_GE(blas_before, 1);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int threads : {3, 1, 2, 1}) {
    ASSERT_TRUE(SetBlasThreads(threads));
    EXPECT_EQ(BlasThreads(), threads) << BlasName(blas);
    int in_new_thread = 0;
    std::thread([&] { in_new_thread = BlasThreads(); }).join();
    if (blas == Blas::kMkl) {
      EXPECT_EQ(in_new_thread, std::min(threads, cores))
          << BlasName(blas) << ", " << cores << " cores";
    } else {
      EXPECT_EQ(in_new_thread, threads) << BlasName(blas);
    }
  }
  // Separate from the intra-op count, set in the order the launcher sets them.
  at::set_num_threads(1);
  ASSERT_TRUE(SetBlasThreads(2));
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(BlasThreads(), 2);
  at::set_num_threads(intra_before);
  SetBlasThreads(blas_before);
}

// A worker sets the counts first thing, on a thread LibTorch has not yet
// initialised for intra-op work; that init (at the first at::get_num_threads
// or parallel_for) must not put MKL back to the intra-op count.
TEST(TorchCompatBlasTest, BlasThreadsSurviveLibTorchsFirstUseOfAThread) {
  const int intra_before = at::get_num_threads();
  at::set_num_threads(1);
  int intra = 0, blas = 0, after_parallel = 0;
  std::thread([&] {
    ASSERT_TRUE(SetBlasThreads(2));
    intra = at::get_num_threads();
    blas = BlasThreads();
    at::parallel_for(0, 4, 1, [](int64_t, int64_t) {});
    after_parallel = BlasThreads();
  }).join();
  EXPECT_EQ(intra, 1);
  EXPECT_EQ(blas, 2) << BlasName(BlasInUse());
  EXPECT_EQ(after_parallel, 2) << BlasName(BlasInUse());
  at::set_num_threads(intra_before);
}

// The kernel name is OpenBLAS's own: the one its build description names too,
// and the one OPENBLAS_CORETYPE forced, when a run sets it (CI's Prescott run).
TEST(TorchCompatBlasTest, OpenBlasNamesItsKernel) {
  if (BlasInUse() != Blas::kOpenBlas) {
    EXPECT_EQ(BlasCoreName(), "");
    EXPECT_EQ(BlasDescription(), BlasName(BlasInUse()));
    return;
  }
  const std::string core = BlasCoreName();
  ASSERT_FALSE(core.empty());
  EXPECT_NE(BlasDescription().find("OpenBLAS"), std::string::npos) << BlasDescription();
  EXPECT_NE(BlasDescription().find(core), std::string::npos) << BlasDescription();
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced != nullptr && std::string(forced) == "Prescott") {
    EXPECT_EQ(core, "Prescott");
  }
}

TEST(TorchCompatBlasTest, BlasNamesAndVariables) {
  EXPECT_STREQ(BlasName(Blas::kOpenBlas), "OpenBLAS");
  EXPECT_STREQ(BlasName(Blas::kMkl), "MKL");
  EXPECT_STREQ(BlasName(Blas::kUnknown), "unknown BLAS");
  EXPECT_STREQ(BlasThreadsVariable(Blas::kOpenBlas), "OPENBLAS_NUM_THREADS");
  EXPECT_STREQ(BlasThreadsVariable(Blas::kMkl), "MKL_NUM_THREADS");
  EXPECT_EQ(BlasThreadsVariable(Blas::kUnknown), nullptr);
}

}  // namespace
}  // namespace pp::torch_compat
