// A c10d backend for ranks that share a GPU: collectives and p2p on device
// tensors go through host buffers and the group's Gloo backend.
//
// NCCL refuses two ranks of one communicator on one GPU, and the lent GPU
// machines have one GPU. With parallelism.ranks_per_device > 1 every process
// group gets this backend for CUDA tensors instead of NCCL (process_group.h
// GroupOptions::host_staged), so pp = 2 and 4 (and dp = 2) run on one GPU for
// tests and small experiments. It is not fast: every transfer crosses PCIe
// twice and Gloo's TCP loopback once, and a send waits on the host for the
// kernels that produce its payload.
//
// Streams and events, as NCCL's backend does them for the caller's current
// stream (pipeline/runtime/device_streams.h posts sends on a send stream that
// waits for the compute stream, and receives on a receive stream that the
// compute stream then waits for):
//   send:       the payload is copied into a pinned host buffer on the
//               caller's current stream, the host waits for that copy (so for
//               the kernels queued before it on that stream, and only them),
//               then Gloo sends the host buffer.
//   recv:       Gloo receives into a pinned host buffer; Work::wait() waits
//               for Gloo, then queues the copy into the device tensor on the
//               caller's current stream (non-blocking: the host does not wait
//               for it; the caching host allocator keeps the pinned buffer
//               until the copy has run).
//   allreduce, broadcast, allgather: inputs staged as for a send, Gloo runs
//               the collective on the host buffers, wait() copies the results
//               back as for a receive.
//   barrier:    Gloo's barrier.
// Other collectives are refused by c10d::Backend naming this backend.
//
// Every wait has the caller's timeout (Gloo's Work::wait). Staging copies
// happen on the calling thread.
#ifndef TOPOLOGY_HOST_STAGED_BACKEND_H_
#define TOPOLOGY_HOST_STAGED_BACKEND_H_

#include <chrono>

#include <c10/core/DeviceType.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/status/status.h"

namespace pp {

// The name the backend reports (c10d errors name it).
inline constexpr char kHostStagedBackendName[] = "pipe_host_staged";

// Adds the backend for `device_type` tensors to `group`, whose CPU backend
// must be Gloo (NewGlooGroup's groups). After it, `group`'s send, recv,
// allreduce, broadcast, allgather and barrier on `device_type` tensors run as
// the file comment says. `device_type` may be the CPU (tests: the staging
// then copies within host memory and replaces the direct Gloo path for CPU
// tensors). FailedPrecondition naming the LibTorch when it has no c10d
// backends (1.13) or `group` has no CPU backend.
absl::Status AddHostStagedBackend(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                  c10::DeviceType device_type);

// Whether this build can add the backend (LibTorch 2.x).
bool HostStagedBackendAvailable();

}  // namespace pp

#endif  // TOPOLOGY_HOST_STAGED_BACKEND_H_
