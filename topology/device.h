// Which device a rank computes on: `--device=cpu` (default) or `cuda`, where
// rank r of a node runs on cuda:<LOCAL_RANK>. A CUDA rank's process groups get
// c10d's NCCL backend for CUDA tensors beside Gloo for CPU ones
// (GroupOptions::nccl, process_group.h).
//
//   PP_ASSIGN_OR_RETURN(DeviceKind kind, ParseDeviceKind(flag));
//   PP_ASSIGN_OR_RETURN(torch::Device device, DeviceForLocalRank(kind, env.local_rank));
//
// Asking for CUDA where there is none is an error naming the device and why
// (this binary's LibTorch has no CUDA, no GPU is visible, or fewer GPUs than
// local ranks), never a silent fall back to the CPU.
#ifndef TOPOLOGY_DEVICE_H_
#define TOPOLOGY_DEVICE_H_

#include <chrono>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
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
// cuda:<local_rank>. FailedPrecondition naming the device when it is not
// there: a LibTorch without CUDA (build with --config=cuda), no visible GPU, or
// local_rank >= the number of visible GPUs. InvalidArgument for local_rank < 0.
absl::StatusOr<c10::Device> DeviceForLocalRank(DeviceKind kind, int local_rank);

// For tests parametrised over devices: the device of rank 0 of a test with
// `ranks` ranks (rank r uses cuda:r), or FailedPrecondition saying why it
// cannot run here, naming the missing GPUs and this binary's LibTorch ("needs
// 1 visible CUDA GPU, this process sees 0 (LibTorch 1.13.1, built without
// CUDA)"). Tests GTEST_SKIP() with the message.
absl::StatusOr<c10::Device> TestDevice(DeviceKind kind, int ranks = 1);

// Device-generic helpers (c10's stream/event interface: no CUDA API here, so
// they compile in every build and do nothing more than a check on the CPU).

// Waits until the work queued so far on `device`'s current stream has run
// (records an event and polls it), at most `timeout`: DeadlineExceeded naming
// the device and `what` otherwise. OK at once for the CPU.
absl::Status WaitForDevice(const c10::Device& device, std::chrono::milliseconds timeout,
                           const std::string& what);

// Host copies of `tensors` for writing them out (checkpoints): CPU tensors are
// returned as they are; device tensors are copied into page-locked (pinned)
// host buffers asynchronously, then one wait per device (WaitForDevice) makes
// every copy complete. Undefined tensors stay undefined.
absl::StatusOr<std::vector<at::Tensor>> ToHost(const std::vector<at::Tensor>& tensors,
                                               std::chrono::milliseconds timeout);

// `tensors` on `device`: a CPU tensor bound for an accelerator is pinned first
// and copied non_blocking (ordered on the device's current stream, so later
// work there sees the data); tensors already on `device` are returned as they
// are. Undefined tensors stay undefined.
std::vector<at::Tensor> ToDevice(const std::vector<at::Tensor>& tensors, const c10::Device& device);

}  // namespace pp

#endif  // TOPOLOGY_DEVICE_H_
