// Moving tensors between the host and a rank's device, and waiting for a
// device: what the device runtime (pipeline/runtime device_batches, the
// executor's timings) and checkpoints (pinned host buffers) share.
//
//   std::vector<at::Tensor> on = ToDevice(batch, device);     // pinned, non_blocking
//   PP_ASSIGN_OR_RETURN(auto host, ToHost(weights, timeout));  // pinned, one wait
//
// Only c10's device-generic stream/event interface is used (no CUDA API), so
// this compiles in every build; on the CPU each call is a no-op or a check.
#ifndef TOPOLOGY_DEVICE_TRANSFER_H_
#define TOPOLOGY_DEVICE_TRANSFER_H_

#include <chrono>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pp {

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

#endif  // TOPOLOGY_DEVICE_TRANSFER_H_
