#include "topology/thread_ranks.h"

#include <atomic>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/torch_compat.h"
#include "common/torch_status.h"
#include "topology/device.h"

namespace pp {
namespace {

using std::chrono::seconds;

TEST(ThreadRanksTest, RanksShareOneWorldOverFileStore) {
  std::atomic<int> seen{0};
  absl::Status s = RunOnThreadRanks(3, seconds(20), [&](World& world) -> absl::Status {
    std::vector<at::Tensor> t = {at::full({1}, world.rank, at::kLong)};
    absl::Status r = TorchCall("all-reduce", [&] { world.group->allreduce(t)->wait(); });
    if (!r.ok()) return r;
    if (world.size != 3 || t[0].item<int64_t>() != 0 + 1 + 2) {
      return absl::InternalError(absl::StrCat("size ", world.size, " sum ", t[0].item<int64_t>()));
    }
    seen.fetch_add(1);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(seen.load(), 3);
}

TEST(ThreadRanksTest, FirstErrorByRankIsPrefixedWithTheRank) {
  absl::Status s = RunOnThreadRanks(3, seconds(20), [](World& world) -> absl::Status {
    if (world.rank == 0) return absl::OkStatus();
    return absl::NotFoundError(absl::StrCat("no file for ", world.rank));
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "rank 1: no file for 1");
}

TEST(ThreadRanksTest, ExceptionInBodyBecomesThatRanksStatus) {
  absl::Status s = RunOnThreadRanks(2, seconds(20), [](World& world) -> absl::Status {
    if (world.rank == 1) throw std::runtime_error("boom");
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "boom")) << s;
}

TEST(ThreadRanksTest, GridHasTheRequestedShape) {
  std::atomic<int> ranks{0};
  absl::Status s = RunOnGrid(2, 2, seconds(20), [&](ParallelGrid& grid) -> absl::Status {
    if (grid.num_stages() != 2 || grid.data_parallel_size() != 2 ||
        grid.stage_id() != grid.global_rank() / 2 ||
        grid.data_parallel_id() != grid.global_rank() % 2) {
      return absl::InternalError(absl::StrCat("rank ", grid.global_rank(), " stage ",
                                              grid.stage_id(), " dp ", grid.data_parallel_id()));
    }
    ranks.fetch_add(1);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(ranks.load(), 4);
}

TEST(ThreadRanksTest, FreshTempPathsDiffer) { EXPECT_NE(FreshTempPath("x"), FreshTempPath("x")); }

TEST(ThreadRanksTest, TestDeviceNamesTheMissingGpus) {
  EXPECT_TRUE(TestDevice(DeviceKind::kCpu, 4)->is_cpu());
  const int gpus = VisibleCudaDevices();
  auto one = TestDevice(DeviceKind::kCuda, gpus + 1);
  EXPECT_EQ(one.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(one.status().message(),
            "needs " + std::to_string(gpus + 1) + " visible CUDA GPU" + (gpus == 0 ? "" : "s") +
                ", this process sees " + std::to_string(gpus) + " (LibTorch " +
                torch_compat::LibTorchVersion() +
                (torch_compat::BuiltWithCuda() ? ", built with CUDA)" : ", built without CUDA)"));
}

}  // namespace
}  // namespace pp
