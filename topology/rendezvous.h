// Rendezvous: from torchrun's environment to a c10d store and world group.
//
// A worker started by the launcher (topology/launcher.h) or by torchrun finds
// MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE
// in its environment. Rank 0 hosts a TCPStore on MASTER_PORT, the others
// connect to it, and all build the Gloo world group. Tests (threads in one
// process) can use a FileStore path instead of TCP.
//
//   PP_ASSIGN_OR_RETURN(pp::World world, pp::RendezvousFromEnv({}));
//   PP_ASSIGN_OR_RETURN(pp::ParallelGrid grid, pp::ParallelGrid::Create(world, topology));
//
// Next: topology/parallel_grid.h.
#ifndef TOPOLOGY_RENDEZVOUS_H_
#define TOPOLOGY_RENDEZVOUS_H_

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "topology/device.h"
#include "topology/process_group.h"

namespace pp {

// torchrun's variables, parsed.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR, default loopback
  int master_port = 29500;
  // PP_RUN_ID (the launcher sets one per launch): rank 0 records it in the
  // store and every other rank checks it before it touches the store, so a
  // rank of another launch on the same port is refused without disturbing
  // this run. Empty (torchrun, a hand-made environment): no check.
  std::string run_id;
  // PP_LAUNCH_ID: one per launcher process (so per node), shared by the
  // workers it starts. Rank 0 records its launch in the store before the run
  // id; the first rank of every other node records its node's. A rank whose
  // node was started by another launch (a second launch with the same port
  // and PP_RUN_ID) is refused before it writes anything there, so it cannot
  // take over a rank of the running run. Empty: no check.
  std::string launch_id;
  // GROUP_RANK (the launcher's node rank); 0 when unset.
  int node_rank = 0;
};

// The environment variables that carry DistEnv::run_id and launch_id.
inline constexpr char kRunIdVariable[] = "PP_RUN_ID";
inline constexpr char kLaunchIdVariable[] = "PP_LAUNCH_ID";

// Reads the variables above from the environment. RANK and WORLD_SIZE are
// required; MASTER_PORT is required when WORLD_SIZE > 1; LOCAL_RANK defaults
// to RANK and LOCAL_WORLD_SIZE to WORLD_SIZE; MASTER_ADDR to 127.0.0.1.
// InvalidArgument names a missing or malformed variable and its value.
absl::StatusOr<DistEnv> DistEnvFromEnvironment();

struct RendezvousOptions {
  // Bounds the store's connection, the world group's rendezvous and, through
  // GroupOptions, every collective of every group built from this world.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Non-empty: a c10d::FileStore at this path instead of the TCPStore (every
  // rank must see the same file; it must not exist yet or be left over).
  std::string file_store_path;
  // Address the Gloo device binds (and advertises to the other ranks). Empty:
  // 127.0.0.1 when MASTER_ADDR is a loopback address; else the interface
  // GLOO_SOCKET_IFNAME names, if set; else this host's address on the route
  // to MASTER_ADDR (LocalAddressTowards), not the host name's (which Debian
  // resolves to a loopback address other hosts cannot reach).
  std::string bind_address;
  // kCuda: this rank computes on cuda:<LOCAL_RANK> (checked before the store is
  // opened: FailedPrecondition naming the device when it is not there), and
  // every group gets NCCL for CUDA tensors (GroupOptions::nccl).
  DeviceKind device = DeviceKind::kCpu;
  // kCuda with ranks_per_device > 1: local rank r computes on
  // cuda:<r / ranks_per_device>, and every group carries CUDA tensors through
  // host buffers and Gloo instead of NCCL (GroupOptions::host_staged), since
  // NCCL cannot have two ranks on one GPU. For tests and small experiments.
  int ranks_per_device = 1;
  // Nice value for the Gloo device's transport thread (0: the worker's own;
  // topology/transport_thread.h says why a higher one helps when the ranks'
  // compute threads use every core).
  int transport_thread_nice = 0;
};

// What a rank knows after rendezvous. Copyable (handles are shared).
struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  StorePtr store;
  ProcessGroupPtr group;                     // all ranks, group rank == rank
  GroupOptions group_options;                // to build more groups (ParallelGrid does)
  c10::Device device{c10::DeviceType::CPU};  // where this rank computes (RendezvousOptions)
};

// Store + world group for `env`. Blocks until every rank has arrived, at most
// options.timeout; then DeadlineExceeded (a rank that never came, or no store
// to connect to). Unavailable when rank 0 cannot host the store (port in use).
// FailedPrecondition naming both run ids when the store belongs to a run
// with another env.run_id (two launches on one port), or naming the node when
// its ranks were started by another launch (env.launch_id; same run id).
// Keep the World alive until every rank is done with the store (rank 0 hosts
// it): end with a barrier on world.group.
absl::StatusOr<World> Rendezvous(const DistEnv& env, const RendezvousOptions& options);

// Rendezvous(DistEnvFromEnvironment(), options).
absl::StatusOr<World> RendezvousFromEnv(const RendezvousOptions& options);

// A TCP port on `address` that was free a moment ago (bind to port 0, read the
// port, close). Racy by nature: fine where the store binds it at once (tests);
// the launcher holds a ReservedPort (reserved_port.h) until its workers end.
absl::StatusOr<int> PickFreePort(const std::string& address = "127.0.0.1");

// The address this host sends from when it talks to `host` (a name or an
// address): the kernel's route choice, found without sending anything.
// NotFound when `host` does not resolve, Unavailable when no route leads there.
absl::StatusOr<std::string> LocalAddressTowards(const std::string& host);

// True for 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackAddress(const std::string& address);

}  // namespace pp

#endif  // TOPOLOGY_RENDEZVOUS_H_
