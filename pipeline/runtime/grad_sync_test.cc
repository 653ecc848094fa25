#include "pipeline/runtime/grad_sync.h"

#include <chrono>
#include <cmath>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "common/status_macros.h"
#include "topology/device.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

using std::chrono::milliseconds;

absl::Status Check(bool cond, const std::string& what) {
  return cond ? absl::OkStatus() : absl::InternalError(what);
}

torch::Tensor Param(std::vector<float> values, std::vector<float> grad) {
  torch::Tensor p = torch::tensor(values).requires_grad_(true);
  if (!grad.empty()) p.mutable_grad() = torch::tensor(grad);
  return p;
}

// Two ranks hold copies of one tied weight: broadcast makes them equal, the
// tied all-reduce sums their gradients, and the norm counts the weight once.
TEST(GradSyncTest, TiedBroadcastSumAndNormCountOnce) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
    torch::Tensor tied =
        Param(world.rank == 0 ? std::vector<float>{1, 2} : std::vector<float>{9, 9},
              world.rank == 0 ? std::vector<float>{1, 0} : std::vector<float>{2, 2});
    torch::Tensor own = Param({0}, {world.rank == 0 ? 3.0f : 4.0f});
    TiedParams tie;
    tie.key = "embed";
    tie.group = world.group;
    tie.members = "tie group [0,1]";
    tie.params = {tied};
    tie.counts_in_norm = world.rank == 0;
    PP_RETURN_IF_ERROR(BroadcastTiedParams({tie}, milliseconds(5000)));
    PP_RETURN_IF_ERROR(
        Check(torch::equal(tied.detach(), torch::tensor({1.0f, 2.0f})), "broadcast from rank 0"));
    PP_RETURN_IF_ERROR(AllReduceTiedGrads({tie}, milliseconds(5000)));
    PP_RETURN_IF_ERROR(
        Check(torch::equal(tied.grad(), torch::tensor({3.0f, 2.0f})), "tied grads summed"));
    std::vector<torch::Tensor> counted = {own};
    if (tie.counts_in_norm) counted.push_back(tied);
    PP_ASSIGN_OR_RETURN(
        double norm, GlobalGradNorm(counted, world.group, c10::intrusive_ptr<c10d::ProcessGroup>(),
                                    milliseconds(5000)));
    // 3^2 + 4^2 + (3^2 + 2^2) once = 38.
    PP_RETURN_IF_ERROR(
        Check(std::abs(norm - std::sqrt(38.0)) < 1e-5, "norm " + std::to_string(norm)));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Data-parallel average, with a parameter that has no gradient on one rank.
TEST(GradSyncTest, AverageGradsTreatsMissingGradAsZero) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
    torch::Tensor a =
        Param({0, 0}, world.rank == 0 ? std::vector<float>{2, 4} : std::vector<float>{4, 8});
    torch::Tensor b = Param({0}, world.rank == 0 ? std::vector<float>{6} : std::vector<float>{});
    PP_RETURN_IF_ERROR(AverageGrads({a, b}, world.group, milliseconds(5000)));
    PP_RETURN_IF_ERROR(Check(torch::equal(a.grad(), torch::tensor({3.0f, 6.0f})), "average"));
    PP_RETURN_IF_ERROR(
        Check(b.grad().defined() && b.grad().item<float>() == 3.0f, "missing grad as zero"));
    // Averaged over the data group, the norm is the replicas' common norm.
    PP_ASSIGN_OR_RETURN(
        double norm, GlobalGradNorm({a, b}, c10::intrusive_ptr<c10d::ProcessGroup>(), world.group,
                                    milliseconds(5000)));
    PP_RETURN_IF_ERROR(Check(std::abs(norm - std::sqrt(9.0 + 36.0 + 9.0)) < 1e-5, "norm"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GradSyncTest, ClipScalesOnlyAboveMaxNorm) {
  torch::Tensor p = Param({0, 0}, {3, 4});
  ClipGradsToNorm({p}, 5.0, 10.0);
  EXPECT_TRUE(torch::equal(p.grad(), torch::tensor({3.0f, 4.0f})));
  ClipGradsToNorm({p}, 5.0, 1.0);
  EXPECT_TRUE(torch::allclose(p.grad(), torch::tensor({0.6f, 0.8f}), 1e-5));
}

// A member that never joins the collective: the error names the collective
// and the group instead of hanging.
TEST(GradSyncTest, MissingMemberTimesOut) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
    // Rank 1 stays out of the collective, and alive, until rank 0 has timed
    // out (a store barrier: no sleep to outlast the timeout under load).
    if (world.rank == 1) return AfterAllRanks(world, "all-reduce timed out");
    TiedParams tie{"embed", world.group, "tie group [0,1]", {Param({1}, {1})}, true};
    absl::Status r = AllReduceTiedGrads({tie}, milliseconds(500));
    return AfterAllRanks(world, "all-reduce timed out",
                         Check(absl::IsDeadlineExceeded(r) &&
                                   absl::StrContains(r.message(), "all-reduce of 'embed'") &&
                                   absl::StrContains(r.message(), "tie group [0,1]") &&
                                   absl::StrContains(r.message(), "500 ms"),
                               "expected a timeout naming the tie group: " + r.ToString()));
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Tied broadcast/sum, data-parallel averaging and the global norm with the
// parameters on each device (two GPUs: NCCL; one GPU shared by both ranks: host-staged Gloo; the
// CPU: Gloo).
class GradSyncDeviceTest : public ::testing::TestWithParam<TestPlacement> {};

TEST_P(GradSyncDeviceTest, TiedSumAverageAndNormOnTheDevice) {
  const TestPlacement& placement = GetParam();
  absl::StatusOr<c10::Device> first = TestDevice(placement.kind, 2, placement.RanksPerDevice(2));
  if (!first.ok()) GTEST_SKIP() << first.status().message();
  absl::Status s = RunOnThreadRanks(
      2, placement.kind, placement.RanksPerDevice(2), milliseconds(60000),
      [](World& world) -> absl::Status {
        const c10::Device device = world.device;
        auto param = [&](std::vector<float> values, std::vector<float> grad) {
          torch::Tensor p = torch::tensor(values).to(device).requires_grad_(true);
          p.mutable_grad() = torch::tensor(grad).to(device);
          return p;
        };
        torch::Tensor tied =
            param(world.rank == 0 ? std::vector<float>{1, 2} : std::vector<float>{9, 9},
                  world.rank == 0 ? std::vector<float>{1, 0} : std::vector<float>{2, 2});
        torch::Tensor own = param({0}, {world.rank == 0 ? 3.0f : 5.0f});
        TiedParams tie;
        tie.key = "embed";
        tie.group = world.group;
        tie.members = "tie group [0,1]";
        tie.params = {tied};
        PP_RETURN_IF_ERROR(BroadcastTiedParams({tie}, milliseconds(60000)));
        PP_RETURN_IF_ERROR(
            Check(torch::equal(tied.detach().cpu(), torch::tensor({1.0f, 2.0f})), "broadcast"));
        PP_RETURN_IF_ERROR(AllReduceTiedGrads({tie}, milliseconds(60000)));
        PP_RETURN_IF_ERROR(
            Check(torch::equal(tied.grad().cpu(), torch::tensor({3.0f, 2.0f})), "tied sum"));
        PP_RETURN_IF_ERROR(AverageGrads({own}, world.group, milliseconds(60000)));
        PP_RETURN_IF_ERROR(
            Check(torch::equal(own.grad().cpu(), torch::tensor({4.0f})), "data average"));
        PP_RETURN_IF_ERROR(Check(own.grad().device() == device && tied.grad().device() == device,
                                 "gradients stay on the device"));
        // Norm over the pipe "group" (this world) counting the tie on rank 0
        // only: sqrt(3^2 + 2^2 + 4^2 + 4^2).
        std::vector<torch::Tensor> counted = {own};
        if (world.rank == 0) counted.push_back(tied);
        PP_ASSIGN_OR_RETURN(double norm, GlobalGradNorm(counted, world.group, ProcessGroupPtr(),
                                                        milliseconds(60000), device));
        return Check(std::abs(norm - std::sqrt(45.0)) < 1e-6, "global norm");
      });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Devices, GradSyncDeviceTest, ::testing::ValuesIn(TestPlacements()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pp
