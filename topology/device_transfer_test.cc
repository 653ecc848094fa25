#include "topology/device_transfer.h"

#include <chrono>
#include <string>
#include <vector>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
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

// What the executor's traces rely on (a device's action is timed after
// WaitForDevice): it returns only once the work queued before it has run, and
// gives up after its timeout with an error naming the device. On the CPU there
// is nothing queued and it returns at once.
TEST_P(DeviceTransferTest, WaitForDeviceWaitsForQueuedWork) {
  absl::StatusOr<c10::Device> device = TestDevice(GetParam());
  if (!device.ok()) GTEST_SKIP() << device.status().message();
  if (device->is_cpu()) {
    EXPECT_TRUE(WaitForDevice(*device, std::chrono::milliseconds(0), "cpu").ok());
    return;
  }
  c10::impl::VirtualGuardImpl impl(device->type());
  // About 7 TFLOP of matrix products: long enough on any GPU that a wait that
  // returned without waiting is seen, and that a zero timeout runs out.
  auto queue_work = [&] {
    at::Tensor x = torch::randn({4096, 4096}, torch::TensorOptions().device(*device));
    for (int i = 0; i < 50; ++i) x = torch::tanh(torch::mm(x, x));
    c10::Event queued(device->type());
    queued.record(impl.getStream(*device));
    return queued;
  };
  c10::Event queued = queue_work();
  absl::Status waited = WaitForDevice(*device, std::chrono::seconds(60), "test");
  ASSERT_TRUE(waited.ok()) << waited;
  EXPECT_TRUE(queued.query()) << "WaitForDevice returned before the queued work ran";
  queue_work();
  absl::Status late = WaitForDevice(*device, std::chrono::milliseconds(0), "a zero timeout");
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_NE(std::string(late.message()).find(device->str()), std::string::npos) << late;
  ASSERT_TRUE(WaitForDevice(*device, std::chrono::seconds(60), "drain").ok());
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceTransferTest,
                         ::testing::Values(DeviceKind::kCpu, DeviceKind::kCuda),
                         [](const auto& info) { return DeviceKindName(info.param); });

}  // namespace
}  // namespace pp
