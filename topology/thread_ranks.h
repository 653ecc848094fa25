// Test harness: runs N ranks as threads of the test process, each with a real
// rendezvous (TCPStore or FileStore) and real Gloo groups, so multi-rank tests
// exercise the distributed engine without spawning processes. Every
// multi-rank test in pipe uses this one target.
//
//   // Per-rank statuses, TCP store on `port` (or options.file_store_path):
//   std::vector<absl::Status> s = RunThreadRanks(4, port, options, [&](World& w) { ... });
//   // A fresh FileStore, the first error (prefixed "rank r: ") or OK:
//   absl::Status s = RunOnThreadRanks(2, timeout, [&](World& w) { ... });
//   // A pp x dp ParallelGrid on every rank:
//   absl::Status s = RunOnGrid(2, 2, timeout, [&](ParallelGrid& grid) { ... });
//
// Every rank thread runs with at::set_num_threads(1) (the ranks share the
// cores), and an exception escaping `body` becomes that rank's kInternal
// status instead of terminating the test.
#ifndef TOPOLOGY_THREAD_RANKS_H_
#define TOPOLOGY_THREAD_RANKS_H_

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "topology/device.h"
#include "topology/parallel_grid.h"
#include "topology/rendezvous.h"

namespace pp {

// Environment of `rank` among `world_size` threads on loopback.
DistEnv ThreadRankEnv(int rank, int world_size, int port);

// Starts ranks [0, world_size) except those in `absent`, each running
// Rendezvous (TCPStore on `port`, or the FileStore options.file_store_path
// when set) and then `body` (if the rendezvous worked); returns each rank's
// status (OK for absent ranks). The world of every rank stays alive until all
// bodies have returned, so no rank's store or group vanishes under another.
std::vector<absl::Status> RunThreadRanks(int world_size, int port, const RendezvousOptions& options,
                                         const std::function<absl::Status(World&)>& body,
                                         const std::vector<int>& absent = {});

// A path under $TEST_TMPDIR (else /tmp) that no other call in this process
// returns and that does not exist: for a FileStore shared by one run's ranks.
std::string FreshTempPath(const std::string& tag);

// The first non-OK status by rank order, its message prefixed "rank r: ";
// OK when all are OK.
absl::Status FirstRankError(const std::vector<absl::Status>& statuses);

// Returns `own` once every rank of `world` has called it with `key` (a
// StoreBarrier on world.store, bounded by world.group_options.timeout). A rank
// that must stay alive and silent until its peers have seen what they expect
// (a timeout, a closed channel) calls it instead of sleeping; each rank passes
// its own result so that a rank whose checks failed still releases the others.
// The barrier's own timeout is returned only when `own` is OK.
absl::Status AfterAllRanks(World& world, const std::string& key, absl::Status own = {});

// For tests parametrised over devices: the device of rank 0 of a test with
// `ranks` ranks (rank r uses cuda:r), or FailedPrecondition saying why it
// cannot run here, naming the missing GPUs and this binary's LibTorch ("needs
// 1 visible CUDA GPU, this process sees 0 (LibTorch 1.13.0, built without
// CUDA)"). Tests GTEST_SKIP() with the message.
// With ranks_per_device > 1 the ranks share GPUs (ceil(ranks /
// ranks_per_device) are needed), which also needs LibTorch 2.x
// (host_staged_backend.h).
absl::StatusOr<c10::Device> TestDevice(DeviceKind kind, int ranks = 1, int ranks_per_device = 1);

// Where the ranks of a device-parametrised multi-rank test run: "cpu",
// "cuda" (rank r on cuda:r, NCCL) or "cuda_shared" (every rank on cuda:0,
// host-staged groups: ranks_per_device = the test's rank count).
struct TestPlacement {
  DeviceKind kind = DeviceKind::kCpu;
  bool share_one_gpu = false;
  std::string name;  // the test-name suffix
  // The ranks_per_device of a test with `ranks` ranks.
  int RanksPerDevice(int ranks) const { return share_one_gpu ? ranks : 1; }
};
// cpu, cuda, cuda_shared.
std::vector<TestPlacement> TestPlacements();

// `world_size` ranks over a fresh FileStore, every wait bounded by `timeout`;
// FirstRankError of their statuses.
absl::Status RunOnThreadRanks(int world_size, std::chrono::milliseconds timeout,
                              const std::function<absl::Status(World&)>& body);
// The same with every rank on `device`: kCuda puts rank r on cuda:r and gives
// the groups NCCL beside Gloo (World::device; tests check TestDevice first).
absl::Status RunOnThreadRanks(int world_size, DeviceKind device, std::chrono::milliseconds timeout,
                              const std::function<absl::Status(World&)>& body);
// The same with `ranks_per_device` ranks on each GPU (rank r on
// cuda:<r / ranks_per_device>; above 1 the groups stage CUDA tensors through
// host buffers and Gloo: RendezvousOptions::ranks_per_device).
absl::Status RunOnThreadRanks(int world_size, DeviceKind device, int ranks_per_device,
                              std::chrono::milliseconds timeout,
                              const std::function<absl::Status(World&)>& body);

// pp * dp ranks, each with the ParallelGrid of PipeDataParallelTopology(pp, dp);
// FirstRankError of their statuses.
absl::Status RunOnGrid(int pp, int dp, std::chrono::milliseconds timeout,
                       const std::function<absl::Status(ParallelGrid& grid)>& body);

}  // namespace pp

#endif  // TOPOLOGY_THREAD_RANKS_H_
