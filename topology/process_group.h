// Making c10d process groups: one Gloo group per (store prefix, member set).
//
// Every group pipe creates (the world, the pipe/data/model axis groups, tie
// groups) goes through NewGlooGroup, so the backend, the timeout and the
// network device are chosen in one place. Only the members of a group call it;
// Gloo's own rendezvous through the store meets them and gives up after the
// timeout instead of hanging when a member never arrives.
//
// Next: topology/rendezvous.h (the world group), topology/parallel_grid.h.
#ifndef TOPOLOGY_PROCESS_GROUP_H_
#define TOPOLOGY_PROCESS_GROUP_H_

#include <chrono>
#include <exception>
#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"

namespace pp {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

// How groups are built. Copyable; the device is shared by every group of a
// process (one Gloo transport thread, not one per group).
struct GroupOptions {
  // Bounds the group's rendezvous and every collective / p2p wait on it.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Gloo transport device. Null: MakeGlooDevice("127.0.0.1").
  std::shared_ptr<::gloo::transport::Device> device;
  // Ranks on GPUs (--device=cuda): each group also gets c10d's NCCL backend,
  // which carries the group's CUDA tensors (CPU tensors stay on Gloo). Needs a
  // --config=cuda build and a GPU per rank; NCCL meets the members at its first
  // collective, not at creation.
  bool nccl = false;
  // Ranks sharing GPUs (parallelism.ranks_per_device > 1), where NCCL cannot
  // run: each group's CUDA tensors go through host buffers and its Gloo
  // backend instead (host_staged_backend.h). Exclusive with `nccl`.
  bool host_staged = false;
};

// A Gloo TCP device bound to `hostname` (an address or a name of this host).
// An empty hostname binds the address this host's name resolves to, falling
// back to loopback; the environment variable GLOO_SOCKET_IFNAME (as in
// PyTorch) picks an interface instead. A `transport_thread_nice` above 0 is
// given to the device's transport thread (topology/transport_thread.h: why);
// out of [0, 19] it is InvalidArgument. Errors name what failed.
absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> MakeGlooDevice(
    const std::string& hostname, int transport_thread_nice = 0);

// A ProcessGroupGloo of `size` members, this one being `rank`, whose keys live
// under `prefix` in `store` (each group needs its own prefix). Blocks until
// all members have called it and finished connecting (a StoreBarrier under
// "<prefix>/connected"), at most options.timeout; then DeadlineExceeded
// naming the prefix. (Gloo's connecting side of a pair returns once it has
// written its hello, before the listening side has adopted the socket; a
// member that dropped its group at once would make its peer's construction
// fail with "Connection closed by peer".) With options.nccl, also the NCCL backend (keys under
// "<prefix>/nccl"); FailedPrecondition naming the group when NCCL cannot be
// added (a build without it, no GPU). REQUIRES: 0 <= rank < size.
absl::StatusOr<ProcessGroupPtr> NewGlooGroup(const StorePtr& store, const std::string& prefix,
                                             int rank, int size, const GroupOptions& options);

// Returns once `size` callers have called it with this `key` on `store` (each
// caller once; a key serves one barrier), at most `timeout`; then
// DeadlineExceeded naming `what`, the key and how many arrived. Used where one
// side must not go on (drop a group, return from a test body) before the
// others have reached a point: a store round trip, no sleep.
absl::Status StoreBarrier(c10d::Store& store, const std::string& key, int size,
                          std::chrono::milliseconds timeout, const std::string& what);

// e.what(), without the C++ backtrace c10::Error carries. (Not named
// ExceptionMessage: pipeline/layers/layer_spec.h has a pp::ExceptionMessage too, and
// two definitions of one name break static links of binaries using both.)
std::string GlooExceptionMessage(const std::exception& e);

// True when a c10d error message reports an expired wait (c10d throws plain
// c10::Error for timeouts: "Socket Timeout", "Timeout waiting for key", ...).
bool LooksLikeTimeout(const std::string& message);

}  // namespace pp

#endif  // TOPOLOGY_PROCESS_GROUP_H_
