#include "pipeline/runtime/thread_ranks.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "absl/strings/str_cat.h"
#include "common/torch_status.h"

namespace pp {

c10::intrusive_ptr<c10d::ProcessGroup> MakeGlooGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::string& name, int my_rank, int size,
                                                     std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name, store);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, my_rank, size, options);
}

absl::Status RunOnThreadRanks(int world_size, std::chrono::milliseconds timeout,
                              const std::function<absl::Status(const ThreadRank&)>& fn) {
  static std::atomic<int> run_counter{0};
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/pp_thread_ranks_",
                                        getpid(), "_", run_counter.fetch_add(1));
  ::unlink(path.c_str());
  std::vector<absl::Status> results(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      at::set_num_threads(1);
      absl::Status inner;
      absl::Status outer = TorchCall(absl::StrCat("rank ", r), [&] {
        ThreadRank tr;
        tr.rank = r;
        tr.world_size = world_size;
        tr.store = c10::make_intrusive<c10d::FileStore>(path, world_size);
        tr.store->setTimeout(timeout);
        tr.world = MakeGlooGroup(tr.store, "world/", r, world_size, timeout);
        inner = fn(tr);
      });
      results[r] = outer.ok() ? inner : outer;
    });
  }
  for (std::thread& t : threads) t.join();
  ::unlink(path.c_str());
  for (int r = 0; r < world_size; ++r) {
    if (!results[r].ok()) return results[r];
  }
  return absl::OkStatus();
}

}  // namespace pp
