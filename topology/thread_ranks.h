// Test helper: runs N ranks as threads of the test process, each with a real
// rendezvous (TCPStore or FileStore) and real Gloo groups.
//
//   std::vector<absl::Status> s = RunThreadRanks(4, options, [&](World& world) { ... });
#ifndef TOPOLOGY_THREAD_RANKS_H_
#define TOPOLOGY_THREAD_RANKS_H_

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "topology/rendezvous.h"

namespace pp {

// Environment of `rank` among `world_size` threads on loopback.
inline DistEnv ThreadRankEnv(int rank, int world_size, int port) {
  DistEnv env;
  env.rank = rank;
  env.world_size = world_size;
  env.local_rank = rank;
  env.local_world_size = world_size;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  return env;
}

// Starts ranks [0, world_size) except those in `absent`, each running
// Rendezvous and then `body` (if the rendezvous worked); returns each rank's
// status (OK for absent ranks). The world of every rank stays alive until all
// bodies have returned, so no rank's store or group vanishes under another.
inline std::vector<absl::Status> RunThreadRanks(int world_size, int port,
                                                const RendezvousOptions& options,
                                                const std::function<absl::Status(World&)>& body,
                                                const std::vector<int>& absent = {}) {
  std::vector<absl::Status> status(world_size);
  std::vector<World> worlds(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    bool skip = false;
    for (int a : absent) skip = skip || a == rank;
    if (skip) continue;
    threads.emplace_back([&, rank] {
      absl::StatusOr<World> world = Rendezvous(ThreadRankEnv(rank, world_size, port), options);
      if (!world.ok()) {
        status[rank] = world.status();
        return;
      }
      worlds[rank] = *world;
      status[rank] = body(worlds[rank]);
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

}  // namespace pp

#endif  // TOPOLOGY_THREAD_RANKS_H_
