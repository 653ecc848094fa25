#include "topology/rendezvous.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "topology/host_staged_backend.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

using ::testing::HasSubstr;

// Sets torchrun's variables for one test and restores "unset" afterwards.
class DistEnvTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* name :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
      unsetenv(name);
    }
  }
  void Set(const char* name, const char* value) { setenv(name, value, 1); }
};

TEST_F(DistEnvTest, ReadsTorchrunVariables) {
  Set("RANK", "5");
  Set("WORLD_SIZE", "8");
  Set("LOCAL_RANK", "1");
  Set("LOCAL_WORLD_SIZE", "4");
  Set("MASTER_ADDR", "10.1.2.3");
  Set("MASTER_PORT", "29511");
  auto env = DistEnvFromEnvironment();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 4);
  EXPECT_EQ(env->master_addr, "10.1.2.3");
  EXPECT_EQ(env->master_port, 29511);
}

TEST_F(DistEnvTest, DefaultsToLoopbackAndLocalEqualsGlobal) {
  Set("RANK", "1");
  Set("WORLD_SIZE", "2");
  Set("MASTER_PORT", "1234");
  auto env = DistEnvFromEnvironment();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->master_addr, "127.0.0.1");
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 2);
}

TEST_F(DistEnvTest, MissingOrMalformedVariablesAreNamed) {
  EXPECT_THAT(DistEnvFromEnvironment().status().message(), HasSubstr("WORLD_SIZE is not set"));
  Set("WORLD_SIZE", "4");
  EXPECT_THAT(DistEnvFromEnvironment().status().message(), HasSubstr("RANK is not set"));
  Set("RANK", "two");
  EXPECT_THAT(DistEnvFromEnvironment().status().message(), HasSubstr("RANK='two'"));
  Set("RANK", "4");
  EXPECT_THAT(DistEnvFromEnvironment().status().message(),
              HasSubstr("RANK=4 is out of range [0, 3]"));
  Set("RANK", "1");
  EXPECT_THAT(DistEnvFromEnvironment().status().message(), HasSubstr("MASTER_PORT is not set"));
  Set("MASTER_PORT", "70000");
  EXPECT_THAT(DistEnvFromEnvironment().status().message(), HasSubstr("MASTER_PORT=70000"));
  Set("MASTER_PORT", "29500");
  Set("WORLD_SIZE", "0");
  EXPECT_THAT(DistEnvFromEnvironment().status().message(), HasSubstr("WORLD_SIZE=0"));
  Set("WORLD_SIZE", "4");
  Set("LOCAL_WORLD_SIZE", "2");
  Set("RANK", "3");
  EXPECT_THAT(DistEnvFromEnvironment().status().message(), HasSubstr("LOCAL_RANK is not set"));
  Set("LOCAL_RANK", "2");
  EXPECT_THAT(DistEnvFromEnvironment().status().message(), HasSubstr("LOCAL_RANK=2"));
  Set("LOCAL_RANK", "1");
  EXPECT_TRUE(DistEnvFromEnvironment().ok());
}

TEST_F(DistEnvTest, RendezvousFromEnvSingleRank) {
  Set("RANK", "0");
  Set("WORLD_SIZE", "1");
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  Set("MASTER_PORT", std::to_string(*port).c_str());
  auto world = RendezvousFromEnv({});
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ(world->group->getSize(), 1);
  EXPECT_EQ(world->group->getRank(), 0);
}

absl::Status AllReduceRanks(World& world) {
  std::vector<at::Tensor> t = {at::full({1}, world.rank + 1, at::kLong)};
  PP_RETURN_IF_ERROR(TorchCall("all-reduce", [&] { world.group->allreduce(t)->wait(); }));
  const int64_t expected = world.size * (world.size + 1) / 2;
  if (t[0].item<int64_t>() != expected) {
    return absl::InternalError(absl::StrCat("sum ", t[0].item<int64_t>(), " want ", expected));
  }
  return absl::OkStatus();
}

TEST(RendezvousTest, ThreeRanksOverTcpStore) {
  at::set_num_threads(1);
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(20);
  auto status = RunThreadRanks(3, *port, options, AllReduceRanks);
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
}

RendezvousOptions ShortTimeout() {
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(2);
  return options;
}

// The ranks that came must give up with a timeout error, not hang.
void ExpectAbsentRankTimesOut(const RendezvousOptions& options, int port) {
  const auto start = std::chrono::steady_clock::now();
  auto status = RunThreadRanks(3, port, options, AllReduceRanks, /*absent=*/{2});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int rank : {0, 1}) {
    EXPECT_EQ(status[rank].code(), absl::StatusCode::kDeadlineExceeded) << status[rank];
    EXPECT_THAT(status[rank].message(), HasSubstr("pp/world")) << status[rank];
  }
  EXPECT_LT(seconds, 15.0);
}

TEST(RendezvousTest, AbsentRankTimesOutOverTcpStore) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  ExpectAbsentRankTimesOut(ShortTimeout(), *port);
}

TEST(RendezvousTest, AbsentRankTimesOutOverFileStore) {
  RendezvousOptions options = ShortTimeout();
  options.file_store_path = absl::StrCat(::testing::TempDir(), "/absent_", getpid());
  ExpectAbsentRankTimesOut(options, 0);
}

TEST(RendezvousTest, CollectiveWithMissingPeerTimesOut) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  auto status = RunThreadRanks(2, *port, ShortTimeout(), [](World& world) -> absl::Status {
    if (world.rank == 1) return absl::OkStatus();  // skips the all-reduce
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = AllReduceRanks(world);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s.ok()) return absl::InternalError("all-reduce without its peer completed");
    if (!absl::StrContains(s.message(), "imed out") && !absl::StrContains(s.message(), "imeout")) {
      return absl::InternalError(absl::StrCat("not a timeout: ", s.message()));
    }
    if (seconds > 10) return absl::InternalError(absl::StrCat("took ", seconds, " s"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(status[0].ok()) << status[0];
}

TEST(RendezvousTest, StoreThatNeverComesUpTimesOut) {
  // Rank 1 alone: nobody hosts the store on this port.
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  auto world = Rendezvous(ThreadRankEnv(1, 2, *port), ShortTimeout());
  EXPECT_EQ(world.status().code(), absl::StatusCode::kDeadlineExceeded) << world.status();
  EXPECT_THAT(world.status().message(), HasSubstr(absl::StrCat("127.0.0.1:", *port)));
}

// Issue #14: two launches on one port; a rank of the second reached the
// first's store and joined its world. With run ids it is refused, naming both,
// and the first run is not disturbed.
TEST(RendezvousTest, ARankOfAnotherRunIsRefused) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(20);
  DistEnv env;
  env.world_size = 2;
  env.local_world_size = 2;
  env.master_port = *port;
  env.run_id = "run-a";
  absl::StatusOr<World> rank0;
  std::thread host([&] { rank0 = Rendezvous(env, options); });
  DistEnv stranger = env;
  stranger.rank = stranger.local_rank = 1;
  stranger.run_id = "run-b";
  absl::StatusOr<World> refused = Rendezvous(stranger, options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("belongs to another run (run id 'run-a'"));
  EXPECT_THAT(refused.status().message(), HasSubstr("this launch is 'run-b'"));
  // The rightful rank 1 still completes the first run's world.
  DistEnv member = stranger;
  member.run_id = "run-a";
  absl::StatusOr<World> rank1 = Rendezvous(member, options);
  host.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  std::thread t0([&] { EXPECT_TRUE(AllReduceRanks(*rank0).ok()); });
  EXPECT_TRUE(AllReduceRanks(*rank1).ok());
  t0.join();
}

// Issue 29: two launches with the same port and the same PP_RUN_ID: a rank
// of the later one passed the run-id check, joined the earlier run's store
// and, in 1 of 8 tries, took a rank's place there and killed that run. Each
// launcher gives its workers a launch id: the stranger (arriving before the
// rightful rank 1 here) is refused naming the node and both launches, and the
// earlier run completes undisturbed.
TEST(RendezvousTest, ARankOfAnotherLaunchWithTheSameRunIdIsRefused) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(20);
  DistEnv env;
  env.world_size = 2;
  env.local_world_size = 2;
  env.master_port = *port;
  env.run_id = "run-a";
  env.launch_id = "launch-1";
  absl::StatusOr<World> rank0;
  std::thread host([&] { rank0 = Rendezvous(env, options); });
  DistEnv stranger = env;
  stranger.rank = stranger.local_rank = 1;
  stranger.launch_id = "launch-2";
  absl::StatusOr<World> refused = Rendezvous(stranger, options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("where node 0's ranks were started by another launch (launch-1; this one "
                        "is launch-2) of the same run id 'run-a'"));
  DistEnv member = stranger;
  member.launch_id = "launch-1";
  absl::StatusOr<World> rank1 = Rendezvous(member, options);
  host.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  std::thread t0([&] { EXPECT_TRUE(AllReduceRanks(*rank0).ok()); });
  EXPECT_TRUE(AllReduceRanks(*rank1).ok());
  t0.join();
}

TEST(RendezvousTest, RejectsBadArguments) {
  RendezvousOptions options;
  EXPECT_THAT(Rendezvous(ThreadRankEnv(3, 2, 1), options).status().message(),
              HasSubstr("rank 3 is out of range [0, 2)"));
  options.timeout = std::chrono::milliseconds(0);
  EXPECT_THAT(Rendezvous(ThreadRankEnv(0, 1, 1), options).status().message(),
              HasSubstr("timeout must be positive"));
}

// Each rank's all-reduce of (rank + 1) over the world group, on `world.device`,
// which must be cuda:<expected_index>: 1 + 2 in each of 4 elements.
absl::Status AllReduceOnTheDevice(World& world, int expected_index, const std::string& what) {
  if (!world.device.is_cuda() || world.device.index() != expected_index) {
    return absl::InternalError(absl::StrCat("rank ", world.rank, " on ", world.device.str()));
  }
  std::vector<at::Tensor> t = {at::full({4}, world.rank + 1.0, at::device(world.device))};
  bool done = false;
  PP_RETURN_IF_ERROR(
      TorchCall(what, [&] { done = world.group->allreduce(t)->wait(std::chrono::seconds(30)); }));
  if (!done || t[0].sum().item<double>() != 12.0) {
    return absl::InternalError(absl::StrCat(what, " gave ", t[0].sum().item<double>()));
  }
  return absl::OkStatus();
}

// Two ranks sharing one GPU (ranks_per_device = 2): both on cuda:0, and the
// world group's CUDA all-reduce goes through host buffers and Gloo (NCCL
// refuses two ranks on one GPU). Where it cannot run, the refusal names why.
TEST(RendezvousTest, CudaRanksSharingOneGpuAllReduceThroughHostBuffers) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(30);
  options.device = DeviceKind::kCuda;
  options.ranks_per_device = 2;
  if (VisibleCudaDevices() < 1 || !HostStagedBackendAvailable()) {
    auto world = Rendezvous(ThreadRankEnv(1, 2, *port), options);
    EXPECT_EQ(world.status().code(), absl::StatusCode::kFailedPrecondition) << world.status();
    EXPECT_THAT(
        world.status().message(),
        HasSubstr(HostStagedBackendAvailable() ? "device cuda:0 (--device=cuda, local rank 1)"
                                               : "--config=cuda"));
    GTEST_SKIP() << "needs a visible CUDA GPU and LibTorch 2.x; only the refusal was checked";
  }
  auto status = RunThreadRanks(2, *port, options, [](World& world) -> absl::Status {
    return AfterAllRanks(world, "shared_gpu_done",
                         AllReduceOnTheDevice(world, 0, "staged all-reduce"));
  });
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
}

// --device=cuda: rank r computes on cuda:r and its groups carry CUDA tensors
// over NCCL. Where the build or the machine lacks the GPUs, Rendezvous refuses
// before opening the store (no waiting for peers), naming the device.
TEST(RendezvousTest, CudaRanksAllReduceOnTheirGpusOrTheDeviceIsNamed) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(30);
  options.device = DeviceKind::kCuda;
  const int gpus = VisibleCudaDevices();
  if (gpus < 2) {
    const auto start = std::chrono::steady_clock::now();
    auto world = Rendezvous(ThreadRankEnv(1, 2, *port), options);
    EXPECT_EQ(world.status().code(), absl::StatusCode::kFailedPrecondition) << world.status();
    EXPECT_THAT(world.status().message(), HasSubstr("device cuda:1 (--device=cuda, local rank 1)"));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    GTEST_SKIP() << "needs 2 visible CUDA GPUs (this machine: " << gpus
                 << "); only the refusal was checked";
  }
  auto status = RunThreadRanks(2, *port, options, [](World& world) -> absl::Status {
    PP_RETURN_IF_ERROR(AllReduceOnTheDevice(world, world.local_rank, "NCCL all-reduce"));
    bool done = false;
    // CPU tensors of the same group still go through Gloo.
    std::vector<at::Tensor> c = {at::full({1}, 1.0)};
    PP_RETURN_IF_ERROR(TorchCall("Gloo all-reduce", [&] {
      done = world.group->allreduce(c)->wait(std::chrono::seconds(30));
    }));
    if (!done || c[0].item<double>() != 2.0) return absl::InternalError("Gloo all-reduce");
    return absl::OkStatus();
  });
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
}

TEST(RendezvousTest, LoopbackAddresses) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackAddress("localhost"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.1"));
  EXPECT_FALSE(PickFreePort("not-an-address").ok());
}

// Gloo advertises the address it binds; across hosts it must be the one on the
// route to the store's host, never the loopback address this host's name may
// resolve to (//driver/e2e:multihost_test runs it across network namespaces).
TEST(RendezvousTest, LocalAddressTowardsIsTheRoutesSource) {
  absl::StatusOr<std::string> loop = LocalAddressTowards("127.0.0.1");
  ASSERT_TRUE(loop.ok()) << loop.status();
  EXPECT_EQ(*loop, "127.0.0.1");
  ifaddrs* addrs = nullptr;
  ASSERT_EQ(::getifaddrs(&addrs), 0);
  int checked = 0;
  for (const ifaddrs* a = addrs; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                sizeof(text));
    // A packet to one of this host's own addresses is sent from that address.
    absl::StatusOr<std::string> local = LocalAddressTowards(text);
    ASSERT_TRUE(local.ok()) << text << ": " << local.status();
    EXPECT_EQ(*local, text);
    ++checked;
  }
  ::freeifaddrs(addrs);
  EXPECT_GE(checked, 1);  // at least lo
}

}  // namespace
}  // namespace pp
