#include "topology/device_transfer.h"

#include <algorithm>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "absl/strings/str_cat.h"

namespace pp {

absl::Status WaitForDevice(const c10::Device& device, std::chrono::milliseconds timeout,
                           const std::string& what) {
  if (device.is_cpu()) return absl::OkStatus();
  c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream stream = impl.getStream(device);
  c10::Event event(device.type());
  event.record(stream);
  // Poll: spin briefly (most waits are short), then back off to 100 us sleeps.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int polls = 0; !event.query(); ++polls) {
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": device ", device.str(), " did not finish its queued work within ",
                       timeout.count(), " ms (a kernel or a transfer waiting on a peer hangs)"));
    }
    if (polls < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<at::Tensor>> ToHost(const std::vector<at::Tensor>& tensors,
                                               std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  std::vector<c10::Device> devices;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.device().is_cpu()) {
      out.push_back(t);
      continue;
    }
    at::Tensor host = at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(true));
    host.copy_(t.detach(), /*non_blocking=*/true);
    out.push_back(std::move(host));
    if (std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  for (const c10::Device& device : devices) {
    absl::Status s = WaitForDevice(device, timeout, "copying tensors to pinned host memory");
    if (!s.ok()) return s;
  }
  return out;
}

std::vector<at::Tensor> ToDevice(const std::vector<at::Tensor>& tensors,
                                 const c10::Device& device) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.device() == device) {
      out.push_back(t);
    } else if (t.device().is_cpu() && !device.is_cpu()) {
      // A non_blocking copy from pageable memory would be synchronous anyway.
      at::Tensor pinned = t.is_pinned() ? t : t.pin_memory();
      out.push_back(pinned.to(device, /*non_blocking=*/true));
    } else {
      out.push_back(t.to(device));
    }
  }
  return out;
}

}  // namespace pp
