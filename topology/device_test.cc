#include "topology/device.h"

#include <string>

#include <torch/torch.h>

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
}

TEST(DeviceTest, TestDeviceNamesTheMissingGpus) {
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

// The transfer helpers on each device: values survive the round trip, host
// copies are CPU tensors (pinned when they came from a device), and undefined
// tensors pass through.
class DeviceTransferTest : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(DeviceTransferTest, ToDeviceAndToHostRoundTrip) {
  absl::StatusOr<c10::Device> device = TestDevice(GetParam());
  if (!device.ok()) GTEST_SKIP() << device.status().message();
  const at::Tensor a = torch::arange(12, torch::kFloat).reshape({3, 4});
  const at::Tensor b = torch::tensor({7, 8}, torch::kLong);
  std::vector<at::Tensor> on = ToDevice({a, at::Tensor(), b}, *device);
  ASSERT_EQ(on.size(), 3u);
  EXPECT_EQ(on[0].device(), *device);
  EXPECT_FALSE(on[1].defined());
  EXPECT_EQ(on[2].device(), *device);
  if (device->is_cpu()) {
    EXPECT_TRUE(on[0].is_same(a));  // nothing to move
  }
  absl::Status waited = WaitForDevice(*device, std::chrono::seconds(60), "test");
  EXPECT_TRUE(waited.ok()) << waited;
  absl::StatusOr<std::vector<at::Tensor>> host = ToHost(on, std::chrono::seconds(60));
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_EQ(host->size(), 3u);
  EXPECT_TRUE((*host)[0].device().is_cpu());
  EXPECT_EQ((*host)[0].is_pinned(), !device->is_cpu());
  EXPECT_TRUE(torch::equal((*host)[0], a));
  EXPECT_FALSE((*host)[1].defined());
  EXPECT_TRUE(torch::equal((*host)[2], b));
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceTransferTest,
                         ::testing::Values(DeviceKind::kCpu, DeviceKind::kCuda),
                         [](const auto& info) { return DeviceKindName(info.param); });

}  // namespace
}  // namespace pp
