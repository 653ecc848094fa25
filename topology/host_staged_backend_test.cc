#include "topology/host_staged_backend.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "topology/device.h"
#include "topology/process_group.h"
#include "topology/rendezvous.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

constexpr std::chrono::milliseconds kTimeout = std::chrono::seconds(60);

// Two thread ranks, both on the parameter's device (cuda: both on cuda:0,
// as ranks sharing a GPU are), with a fresh group whose `device`-type
// tensors go through the staged backend. On the CPU the backend replaces
// Gloo's direct path for CPU tensors, so the staging code runs here too.
class HostStagedBackendTest : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    if (!HostStagedBackendAvailable()) GTEST_SKIP() << "this LibTorch has no c10d backends";
    absl::StatusOr<c10::Device> device = TestDevice(GetParam());
    if (!device.ok()) GTEST_SKIP() << device.status().message();
    device_ = *device;
  }

  // Runs `body(group, rank)` on two ranks, each with its own staged group.
  absl::Status OnTwoRanks(
      const std::function<absl::Status(const ProcessGroupPtr&, int rank)>& body) {
    return RunOnThreadRanks(2, kTimeout, [&](World& world) -> absl::Status {
      absl::StatusOr<ProcessGroupPtr> group =
          NewGlooGroup(world.store, "staged", world.rank, world.size, world.group_options);
      if (!group.ok()) return group.status();
      absl::Status added = AddHostStagedBackend(*group, device_.type());
      if (!added.ok()) return added;
      absl::Status s = body(*group, world.rank);
      return AfterAllRanks(world, "staged_done", s);
    });
  }

  torch::TensorOptions Options() const { return torch::TensorOptions().device(device_); }

  c10::Device device_{c10::DeviceType::CPU};
};

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

TEST_P(HostStagedBackendTest, SendAndRecvMoveDeviceTensors) {
  absl::Status s = OnTwoRanks([&](const ProcessGroupPtr& group, int rank) -> absl::Status {
    // A non-contiguous payload (a transposed view) arrives as its values.
    torch::Tensor sent = torch::arange(12, Options().dtype(torch::kFloat)).view({3, 4}).t();
    if (rank == 0) {
      std::vector<at::Tensor> one = {sent};
      if (!group->send(one, 1, 7)->wait(kTimeout)) return absl::AbortedError("send aborted");
      return absl::OkStatus();
    }
    torch::Tensor got = torch::full({4, 3}, -1.0, Options().dtype(torch::kFloat));
    std::vector<at::Tensor> one = {got};
    auto work = group->recv(one, 0, 7);
    if (!work->wait(kTimeout)) return absl::AbortedError("recv aborted");
    if (!work->isCompleted()) return absl::InternalError("recv not completed after wait");
    if (got.device() != device_) return absl::InternalError("recv changed the tensor's device");
    return Expect(torch::equal(got.cpu(), sent.cpu()),
                  absl::StrCat("received ", got.cpu().toString(), " differs from the payload"));
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(HostStagedBackendTest, CollectivesReduceBroadcastAndGather) {
  absl::Status s = OnTwoRanks([&](const ProcessGroupPtr& group, int rank) -> absl::Status {
    // allreduce (SUM): 1 + 2 on both ranks, a float and a bf16 tensor (one
    // dtype per call, as Gloo wants).
    std::vector<at::Tensor> sums;
    for (c10::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
      std::vector<at::Tensor> one = {torch::full({2, 3}, rank + 1.0, Options().dtype(dtype))};
      if (!group->allreduce(one)->wait(kTimeout)) return absl::AbortedError("allreduce aborted");
      sums.push_back(one[0]);
    }
    for (const at::Tensor& t : sums) {
      if (t.device() != device_) return absl::InternalError("allreduce moved its tensor");
      if (!torch::allclose(t.cpu().to(torch::kFloat), torch::full(t.sizes(), 3.0))) {
        return absl::InternalError(absl::StrCat("allreduce gave ", t.cpu().toString()));
      }
    }
    // broadcast from group rank 1.
    std::vector<at::Tensor> b = {torch::full({3}, rank == 1 ? 42.0 : 0.0, Options())};
    c10d::BroadcastOptions bo;
    bo.rootRank = 1;
    if (!group->broadcast(b, bo)->wait(kTimeout)) return absl::AbortedError("broadcast aborted");
    if (!torch::equal(b[0].cpu(), torch::full({3}, 42.0))) {
      return absl::InternalError(absl::StrCat("broadcast gave ", b[0].cpu().toString()));
    }
    // allgather: each rank's id.
    std::vector<at::Tensor> in = {torch::full({2}, static_cast<double>(rank), Options())};
    std::vector<std::vector<at::Tensor>> out = {
        {torch::zeros({2}, Options()), torch::zeros({2}, Options())}};
    if (!group->allgather(out, in)->wait(kTimeout)) return absl::AbortedError("allgather aborted");
    for (int r = 0; r < 2; ++r) {
      if (!torch::equal(out[0][r].cpu(), torch::full({2}, static_cast<double>(r)))) {
        return absl::InternalError(
            absl::StrCat("allgather slot ", r, " holds ", out[0][r].cpu().toString()));
      }
    }
    if (!group->barrier()->wait(kTimeout)) return absl::AbortedError("barrier aborted");
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A caller that polls sees the operation complete before its wait (the
// runtime releases asynchronous collectives' results so), and the wait then
// delivers the values.
TEST_P(HostStagedBackendTest, CompletesBeforeItsWaitOnceGlooHas) {
  absl::Status s = OnTwoRanks([&](const ProcessGroupPtr& group, int rank) -> absl::Status {
    std::vector<at::Tensor> one = {torch::full({4}, rank + 1.0, Options())};
    c10::intrusive_ptr<c10d::Work> work = group->allreduce(one);
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    while (!work->isCompleted()) {
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError("allreduce never completed without a wait");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!work->wait(kTimeout)) return absl::AbortedError("allreduce aborted");
    return Expect(torch::equal(one[0].cpu(), torch::full({4}, 3.0)),
                  absl::StrCat("allreduce gave ", one[0].cpu().toString()));
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(HostStagedBackendTest, UnsupportedCollectiveNamesTheBackend) {
  absl::Status s = OnTwoRanks([&](const ProcessGroupPtr& group, int) -> absl::Status {
    std::vector<at::Tensor> in = {torch::ones({2}, Options())};
    std::vector<at::Tensor> out = {torch::zeros({2}, Options())};
    std::vector<std::vector<at::Tensor>> inputs = {{in[0], in[0]}};
    try {
      group->reduce_scatter(out, inputs);
    } catch (const std::exception& e) {
      return Expect(std::string(e.what()).find(kHostStagedBackendName) != std::string::npos,
                    absl::StrCat("error does not name the backend: ", e.what()));
    }
    return absl::InternalError("reduce_scatter was not refused");
  });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Devices, HostStagedBackendTest,
                         ::testing::Values(DeviceKind::kCpu, DeviceKind::kCuda),
                         [](const auto& info) { return DeviceKindName(info.param); });

// Where the backend cannot exist (LibTorch 1.13) the refusal names the build
// that has it.
TEST(HostStagedBackendRefusalTest, OldLibTorchIsRefusedNamingTheBuild) {
  if (HostStagedBackendAvailable()) GTEST_SKIP() << "this LibTorch has c10d backends";
  absl::Status s = RunOnThreadRanks(1, kTimeout, [&](World& world) -> absl::Status {
    return AddHostStagedBackend(world.group, c10::DeviceType::CUDA);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("--config=cuda"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("parallelism.ranks_per_device"), std::string::npos) << s;
}

}  // namespace
}  // namespace pp
