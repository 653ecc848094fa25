#include "topology/device_transfer.h"

#include <chrono>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "topology/device.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

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
