// Test helper: runs N ranks as threads of one process, each with its own real
// ProcessGroupGloo over a shared c10d FileStore, so multi-rank tests exercise
// the real distributed engine without spawning processes.
#ifndef PIPELINE_RUNTIME_THREAD_RANKS_H_
#define PIPELINE_RUNTIME_THREAD_RANKS_H_

#include <chrono>
#include <functional>
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/status.h"

namespace pp {

struct ThreadRank {
  int rank = 0;
  int world_size = 1;
  c10::intrusive_ptr<c10d::Store> store;         // shared by all ranks (prefixed per run)
  c10::intrusive_ptr<c10d::ProcessGroup> world;  // this rank's Gloo world group
};

// Creates a Gloo group over `store` for `ranks` (global ranks; `my_rank` must
// be among them); every member must call it with the same `name`.
c10::intrusive_ptr<c10d::ProcessGroup> MakeGlooGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::string& name, int my_rank, int size,
                                                     std::chrono::milliseconds timeout);

// Runs `fn` on `world_size` threads and returns the first non-OK status (by
// rank order) or OK. Sets at::set_num_threads(1) in every rank thread.
absl::Status RunOnThreadRanks(int world_size, std::chrono::milliseconds timeout,
                              const std::function<absl::Status(const ThreadRank&)>& fn);

}  // namespace pp

#endif  // PIPELINE_RUNTIME_THREAD_RANKS_H_
