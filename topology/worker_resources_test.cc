#include "topology/worker_resources.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/torch_compat_blas.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pp {
namespace {

using ::testing::HasSubstr;

TEST(WorkerResourcesTest, ThreadCountSplitsCores) {
  EXPECT_GE(WorkerThreadCount(1), 1);
  EXPECT_EQ(WorkerThreadCount(1 << 20), 1);
  EXPECT_GE(WorkerThreadCount(1), WorkerThreadCount(2));
}

TEST(WorkerResourcesTest, DefaultSplitIsOneIntraOpThreadAndTheCoresShareForBlas) {
  EXPECT_EQ(DefaultWorkerThreads(1).intra_op, 1);
  EXPECT_EQ(DefaultWorkerThreads(1).blas, WorkerThreadCount(1));
  EXPECT_EQ(DefaultWorkerThreads(2).blas, WorkerThreadCount(2));
}

// Sets or unsets the thread variables for one test and restores them after.
class ThreadEnv {
 public:
  ThreadEnv() {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_.emplace_back(v == nullptr ? std::nullopt : std::optional<std::string>(v));
      unsetenv(name);
    }
  }
  ~ThreadEnv() {
    for (size_t i = 0; i < saved_.size(); ++i) {
      if (saved_[i].has_value()) {
        setenv(kNames[i], saved_[i]->c_str(), 1);
      } else {
        unsetenv(kNames[i]);
      }
    }
  }
  static constexpr const char* kNames[] = {"PP_INTRA_OP_THREADS", "PP_BLAS_THREADS",
                                           "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                           "MKL_NUM_THREADS"};

 private:
  std::vector<std::optional<std::string>> saved_;
};

TEST(WorkerResourcesTest, ThreadResolutionOrder) {
  ThreadEnv env;
  auto t = ResolveWorkerThreads(2, {0, 0});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->intra_op, DefaultWorkerThreads(2).intra_op);
  EXPECT_EQ(t->blas, DefaultWorkerThreads(2).blas);
  // OMP_NUM_THREADS sets both (OpenBLAS and MKL fall back to it too).
  setenv("OMP_NUM_THREADS", "3", 1);
  t = ResolveWorkerThreads(2, {0, 0});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->intra_op, 3);
  EXPECT_EQ(t->blas, 3);
  // Only the variable of the BLAS in use counts.
  const torch_compat::Blas blas = torch_compat::BlasInUse();
  ASSERT_NE(blas, torch_compat::Blas::kUnknown);
  const torch_compat::Blas other_blas =
      blas == torch_compat::Blas::kMkl ? torch_compat::Blas::kOpenBlas : torch_compat::Blas::kMkl;
  setenv(torch_compat::BlasThreadsVariable(other_blas), "4", 1);
  t = ResolveWorkerThreads(2, {0, 0});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->blas, 3) << torch_compat::BlasThreadsVariable(other_blas);
  setenv(torch_compat::BlasThreadsVariable(blas), "5", 1);
  t = ResolveWorkerThreads(2, {0, 0});
  EXPECT_EQ(t->intra_op, 3);
  EXPECT_EQ(t->blas, 5);
  setenv("PP_INTRA_OP_THREADS", "6", 1);
  setenv("PP_BLAS_THREADS", "7", 1);
  t = ResolveWorkerThreads(2, {0, 0});
  EXPECT_EQ(t->intra_op, 6);
  EXPECT_EQ(t->blas, 7);
  // Flags win over everything, each on its own.
  t = ResolveWorkerThreads(2, {.intra_op = 2, .blas = 0});
  EXPECT_EQ(t->intra_op, 2);
  EXPECT_EQ(t->blas, 7);
  t = ResolveWorkerThreads(2, {.intra_op = 0, .blas = 4});
  EXPECT_EQ(t->intra_op, 6);
  EXPECT_EQ(t->blas, 4);
}

TEST(WorkerResourcesTest, BadThreadVariableIsNamed) {
  ThreadEnv env;
  setenv("PP_BLAS_THREADS", "two", 1);
  auto t = ResolveWorkerThreads(1, {0, 0});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("PP_BLAS_THREADS='two'"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("integer >= 1"));
}

// `--intra_op_threads=100000` or PP_INTRA_OP_THREADS=4096 started thousands
// of threads per worker and never reached a step (issue 29, finding 4).
TEST(WorkerResourcesTest, ThreadCountsAboveWhatTheMachineRunsAreRefused) {
  ThreadEnv env;
  const int max = MaxWorkerThreads();
  EXPECT_GE(max, 8);
  EXPECT_GE(max, 4 * static_cast<int>(AllowedCores().size()));
  EXPECT_TRUE(ResolveWorkerThreads(1, {.intra_op = max, .blas = max}).ok());
  auto t = ResolveWorkerThreads(1, {.intra_op = 100000, .blas = 0});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr(absl::StrCat("--intra_op_threads=100000 is more threads than this "
                                     "machine can run; valid: 0 (automatic) to ",
                                     max)));
  t = ResolveWorkerThreads(1, {.intra_op = 0, .blas = max + 1});
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr(absl::StrCat("--blas_threads=", max + 1)));
  setenv("PP_INTRA_OP_THREADS", "4096", 1);
  t = ResolveWorkerThreads(1, {0, 0});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr(absl::StrCat("PP_INTRA_OP_THREADS='4096' is not a thread count for this "
                                     "machine; valid: an integer >= 1 and <= ",
                                     max)));
}

// Both builds have a BLAS pipe can set (OpenBLAS: Debian's LibTorch; MKL: the
// wheel's), and the counts read back change with every call, so a setter that
// does nothing fails here.
TEST(WorkerResourcesTest, SetWorkerThreadsReadsBackWhatTheLibrariesUse) {
  const WorkerThreads before = CurrentWorkerThreads();
  ASSERT_GE(before.blas, 1) << DescribeThreads(before);
  for (const WorkerThreads want :
       {WorkerThreads{.intra_op = 1, .blas = 2}, WorkerThreads{.intra_op = 2, .blas = 1},
        WorkerThreads{.intra_op = 1, .blas = 3}}) {
    const WorkerThreads now = SetWorkerThreads(want);
    EXPECT_EQ(now.intra_op, want.intra_op);
    EXPECT_EQ(now.blas, want.blas) << torch_compat::BlasName(torch_compat::BlasInUse());
    EXPECT_EQ(CurrentWorkerThreads().blas, want.blas);
    EXPECT_THAT(
        DescribeThreads(now),
        HasSubstr(absl::StrCat(want.intra_op, " intra-op + ", want.blas, " BLAS thread(s) (",
                               torch_compat::BlasName(torch_compat::BlasInUse()), ")")));
  }
  SetWorkerThreads(before);
}

TEST(WorkerResourcesTest, CoresForWorkerSharesTheAllowedCores) {
  // More workers than cores: one each, round-robin.
  const std::vector<int> two = {0, 1};
  EXPECT_EQ(CoresForWorker(two, 0, 4), std::vector<int>({0}));
  EXPECT_EQ(CoresForWorker(two, 1, 4), std::vector<int>({1}));
  EXPECT_EQ(CoresForWorker(two, 2, 4), std::vector<int>({0}));
  EXPECT_EQ(CoresForWorker(two, 3, 4), std::vector<int>({1}));
  EXPECT_EQ(CoresForWorker(two, 1, 2), std::vector<int>({1}));
  // Fewer: contiguous blocks of the allowed cores (not of 0..n-1).
  const std::vector<int> eight = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(CoresForWorker(eight, 1, 2), std::vector<int>({4, 5, 6, 7}));
  EXPECT_EQ(CoresForWorker(eight, 0, 3), std::vector<int>({0, 1}));
  EXPECT_EQ(CoresForWorker(eight, 2, 3), std::vector<int>({5, 6, 7}));
  const std::vector<int> sparse = {2, 5, 7};
  EXPECT_EQ(CoresForWorker(sparse, 0, 2), std::vector<int>({2}));
  EXPECT_EQ(CoresForWorker(sparse, 1, 2), std::vector<int>({5, 7}));
  EXPECT_EQ(CoresForWorker(sparse, 0, 1), sparse);
  EXPECT_TRUE(CoresForWorker({}, 0, 2).empty());
  EXPECT_TRUE(CoresForWorker(two, 2, 2).empty());
}

TEST(WorkerResourcesTest, DescribeCoresFoldsRuns) {
  EXPECT_EQ(DescribeCores({}), "none");
  EXPECT_EQ(DescribeCores({3}), "3");
  EXPECT_EQ(DescribeCores({0, 1, 2, 3, 6}), "0-3,6");
  EXPECT_EQ(DescribeCores({0, 2, 4, 5}), "0,2,4-5");
}

// The malloc settings go together or not at all, and a person's own win.
TEST(WorkerResourcesTest, MallocVariablesComeInPairsUnlessThePersonSetsTheirOwn) {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr || std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
      std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) {
    GTEST_SKIP() << "this process's environment sets malloc variables";
  }
  using Vars = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(WorkerMallocVariables(), (Vars{{"MALLOC_MMAP_THRESHOLD_", "33554432"},
                                           {"MALLOC_TRIM_THRESHOLD_", "1073741824"}}));
  setenv("MALLOC_TRIM_THRESHOLD_", "5", 1);
  EXPECT_TRUE(WorkerMallocVariables().empty());
  unsetenv("MALLOC_TRIM_THRESHOLD_");
  const Vars threads = WorkerThreadVariables({.intra_op = 2, .blas = 3});
  EXPECT_NE(std::find(threads.begin(), threads.end(),
                      std::make_pair(std::string("OMP_NUM_THREADS"), std::string("2"))),
            threads.end());
  EXPECT_NE(std::find(threads.begin(), threads.end(),
                      std::make_pair(std::string("PP_BLAS_THREADS"), std::string("3"))),
            threads.end());
}

}  // namespace
}  // namespace pp
