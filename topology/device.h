// Which device a rank computes on: `--device=cpu` (default) or `cuda`, where
// rank r of a node runs on cuda:<LOCAL_RANK> (cuda:<LOCAL_RANK / N> when N
// ranks share each GPU: parallelism.ranks_per_device). A CUDA rank's process
// groups get c10d's NCCL backend for CUDA tensors beside Gloo for CPU ones
// (GroupOptions::nccl, process_group.h), or host staging through Gloo when
// ranks share GPUs (GroupOptions::host_staged).
//
//   PP_ASSIGN_OR_RETURN(DeviceKind kind, ParseDeviceKind(flag));
//   PP_ASSIGN_OR_RETURN(torch::Device device, DeviceForLocalRank(kind, env.local_rank));
//
// Asking for CUDA where there is none is an error naming the device and why
// (this binary's LibTorch has no CUDA, no GPU is visible, or fewer GPUs than
// local ranks), never a silent fall back to the CPU.
#ifndef TOPOLOGY_DEVICE_H_
#define TOPOLOGY_DEVICE_H_

#include <string>

#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pp {

enum class DeviceKind { kCpu, kCuda };

// "cpu" or "cuda"; InvalidArgument naming `name` and the valid names otherwise.
absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name);
std::string DeviceKindName(DeviceKind kind);

// Number of CUDA devices this process sees (0 in a build without CUDA or on a
// machine without a GPU; CUDA_VISIBLE_DEVICES applies).
int VisibleCudaDevices();

// The device of the rank with `local_rank` on its node: the CPU, or
// cuda:<local_rank / ranks_per_device> (ranks_per_device consecutive local
// ranks share a GPU: parallelism.ranks_per_device). FailedPrecondition naming
// the device when it is not there: a LibTorch without CUDA (build with
// --config=cuda), no visible GPU, or a GPU index >= the number of visible GPUs.
// InvalidArgument for local_rank < 0 or ranks_per_device < 1, and for
// ranks_per_device > 1 on the CPU (it places ranks on GPUs only).
absl::StatusOr<c10::Device> DeviceForLocalRank(DeviceKind kind, int local_rank,
                                               int ranks_per_device = 1);

}  // namespace pp

#endif  // TOPOLOGY_DEVICE_H_
