#include "topology/device.h"

#include <string>

#include "absl/status/status.h"
#include "common/torch_compat.h"
#include "gtest/gtest.h"

namespace pp {
namespace {

TEST(DeviceTest, ParsesKnownDevicesAndNamesTheBadOne) {
  EXPECT_EQ(*ParseDeviceKind("cpu"), DeviceKind::kCpu);
  EXPECT_EQ(*ParseDeviceKind("cuda"), DeviceKind::kCuda);
  EXPECT_EQ(DeviceKindName(DeviceKind::kCuda), "cuda");
  EXPECT_EQ(DeviceKindName(DeviceKind::kCpu), "cpu");
  for (const char* bad : {"", "gpu", "CUDA", "cuda:0", "tpu"}) {
    auto kind = ParseDeviceKind(bad);
    EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(kind.status().message(),
              std::string("device '") + bad + "' is not a known device; valid: cpu, cuda");
  }
}

TEST(DeviceTest, CpuIsAlwaysThere) {
  for (int local_rank : {0, 3}) {
    auto device = DeviceForLocalRank(DeviceKind::kCpu, local_rank);
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_TRUE(device->is_cpu());
  }
  EXPECT_EQ(DeviceForLocalRank(DeviceKind::kCpu, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Without CUDA in the build, or without a GPU, asking for one names the
// device and the reason; with GPUs, local rank r gets cuda:r and one past the
// last GPU is refused naming the count.
TEST(DeviceTest, CudaFollowsTheLocalRankOrNamesWhyNot) {
  const int gpus = VisibleCudaDevices();
  if (!torch_compat::BuiltWithCuda()) {
    EXPECT_EQ(gpus, 0);
    auto device = DeviceForLocalRank(DeviceKind::kCuda, 1);
    EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(device.status().message().find("device cuda:1 (--device=cuda, local rank 1)"),
              std::string::npos)
        << device.status();
    EXPECT_NE(device.status().message().find("built without CUDA; build with --config=cuda"),
              std::string::npos)
        << device.status();
    return;
  }
  if (gpus == 0) {
    auto device = DeviceForLocalRank(DeviceKind::kCuda, 0);
    EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(device.status().message().find("device cuda:0"), std::string::npos)
        << device.status();
    EXPECT_NE(device.status().message().find("no CUDA GPU is visible"), std::string::npos)
        << device.status();
    GTEST_SKIP() << "no CUDA GPU visible: only the refusal was checked";
  }
  for (int local_rank = 0; local_rank < gpus; ++local_rank) {
    auto device = DeviceForLocalRank(DeviceKind::kCuda, local_rank);
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_TRUE(device->is_cuda());
    EXPECT_EQ(device->index(), local_rank);
  }
  auto past = DeviceForLocalRank(DeviceKind::kCuda, gpus);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(past.status().message().find("this node has " + std::to_string(gpus) + " visible"),
            std::string::npos)
      << past.status();
  EXPECT_NE(past.status().message().find("parallelism.ranks_per_device"), std::string::npos)
      << past.status();
  // Two ranks per GPU: local ranks 2g and 2g + 1 on cuda:g.
  for (int local_rank = 0; local_rank < 2 * gpus; ++local_rank) {
    auto device = DeviceForLocalRank(DeviceKind::kCuda, local_rank, 2);
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_EQ(device->index(), local_rank / 2);
  }
  auto past_shared = DeviceForLocalRank(DeviceKind::kCuda, 2 * gpus, 2);
  EXPECT_EQ(past_shared.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(past_shared.status().message().find("one per 2 local ranks is needed"),
            std::string::npos)
      << past_shared.status();
}

TEST(DeviceTest, RanksPerDeviceIsCheckedOnEveryDevice) {
  auto zero = DeviceForLocalRank(DeviceKind::kCuda, 0, 0);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("parallelism.ranks_per_device = 0 must be >= 1"),
            std::string::npos)
      << zero.status();
  auto cpu = DeviceForLocalRank(DeviceKind::kCpu, 1, 2);
  EXPECT_EQ(cpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cpu.status().message().find("needs --device=cuda"), std::string::npos) << cpu.status();
  auto one = DeviceForLocalRank(DeviceKind::kCpu, 1, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(one->is_cpu());
}

}  // namespace
}  // namespace pp
