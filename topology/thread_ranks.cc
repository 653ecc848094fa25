#include "topology/thread_ranks.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include <ATen/Parallel.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"
#include "common/torch_status.h"
#include "topology/device.h"
#include "topology/host_staged_backend.h"
#include "topology/process_group.h"
#include "topology/process_topology.h"

namespace pp {

DistEnv ThreadRankEnv(int rank, int world_size, int port) {
  DistEnv env;
  env.rank = rank;
  env.world_size = world_size;
  env.local_rank = rank;
  env.local_world_size = world_size;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  return env;
}

std::vector<absl::Status> RunThreadRanks(int world_size, int port, const RendezvousOptions& options,
                                         const std::function<absl::Status(World&)>& body,
                                         const std::vector<int>& absent) {
  std::vector<absl::Status> status(world_size);
  std::vector<World> worlds(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    bool skip = false;
    for (int a : absent) skip = skip || a == rank;
    if (skip) continue;
    threads.emplace_back([&, rank] {
      at::set_num_threads(1);
      absl::Status inner;
      const absl::Status thrown = TorchCall(absl::StrCat("rank ", rank), [&] {
        absl::StatusOr<World> world = Rendezvous(ThreadRankEnv(rank, world_size, port), options);
        if (!world.ok()) {
          inner = world.status();
          return;
        }
        worlds[rank] = *world;
        inner = body(worlds[rank]);
      });
      status[rank] = thrown.ok() ? inner : thrown;
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

std::string FreshTempPath(const std::string& tag) {
  static std::atomic<int> counter{0};
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/pp_", tag, "_", getpid(),
                                        "_", counter.fetch_add(1));
  ::unlink(path.c_str());
  return path;
}

absl::Status AfterAllRanks(World& world, const std::string& key, absl::Status own) {
  absl::Status barrier =
      StoreBarrier(*world.store, absl::StrCat("pp/test/", key), world.size,
                   world.group_options.timeout, absl::StrCat("rank ", world.rank));
  return own.ok() ? barrier : own;
}

absl::StatusOr<c10::Device> TestDevice(DeviceKind kind, int ranks, int ranks_per_device) {
  if (kind == DeviceKind::kCpu) return c10::Device(c10::DeviceType::CPU);
  const int gpus = VisibleCudaDevices();
  const int needed = (ranks + ranks_per_device - 1) / ranks_per_device;
  const std::string build = absl::StrCat(
      " (LibTorch ", torch_compat::LibTorchVersion(),
      torch_compat::BuiltWithCuda() ? ", built with CUDA" : ", built without CUDA", ")");
  if (ranks_per_device > 1 && !HostStagedBackendAvailable()) {
    return absl::FailedPreconditionError(
        absl::StrCat("ranks sharing a GPU need LibTorch 2.x's c10d backends", build));
  }
  if (gpus >= needed) return c10::Device(c10::DeviceType::CUDA, 0);
  return absl::FailedPreconditionError(absl::StrCat(
      "needs ", needed, " visible CUDA GPU", needed == 1 ? "" : "s",
      ranks_per_device > 1 ? absl::StrCat(" (", ranks_per_device, " ranks per GPU)") : "",
      ", this process sees ", gpus, build));
}

std::vector<TestPlacement> TestPlacements() {
  return {TestPlacement{DeviceKind::kCpu, false, "cpu"},
          TestPlacement{DeviceKind::kCuda, false, "cuda"},
          TestPlacement{DeviceKind::kCuda, true, "cuda_shared"}};
}

absl::Status FirstRankError(const std::vector<absl::Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    if (!statuses[r].ok()) {
      return absl::Status(statuses[r].code(),
                          absl::StrCat("rank ", r, ": ", statuses[r].message()));
    }
  }
  return absl::OkStatus();
}

absl::Status RunOnThreadRanks(int world_size, std::chrono::milliseconds timeout,
                              const std::function<absl::Status(World&)>& body) {
  return RunOnThreadRanks(world_size, DeviceKind::kCpu, timeout, body);
}

absl::Status RunOnThreadRanks(int world_size, DeviceKind device, std::chrono::milliseconds timeout,
                              const std::function<absl::Status(World&)>& body) {
  return RunOnThreadRanks(world_size, device, /*ranks_per_device=*/1, timeout, body);
}

absl::Status RunOnThreadRanks(int world_size, DeviceKind device, int ranks_per_device,
                              std::chrono::milliseconds timeout,
                              const std::function<absl::Status(World&)>& body) {
  RendezvousOptions options;
  options.timeout = timeout;
  options.device = device;
  options.ranks_per_device = ranks_per_device;
  options.file_store_path = FreshTempPath("thread_ranks");
  const std::vector<absl::Status> statuses = RunThreadRanks(world_size, 0, options, body);
  ::unlink(options.file_store_path.c_str());
  return FirstRankError(statuses);
}

absl::Status RunOnGrid(int pp, int dp, std::chrono::milliseconds timeout,
                       const std::function<absl::Status(ParallelGrid& grid)>& body) {
  return RunOnThreadRanks(pp * dp, timeout, [&](World& world) -> absl::Status {
    PP_ASSIGN_OR_RETURN(ProcessTopology topology, PipeDataParallelTopology(pp, dp));
    PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, topology));
    return body(grid);
  });
}

}  // namespace pp
