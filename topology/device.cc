#include "topology/device.h"

#include <cstdlib>

#include <ATen/Context.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/torch_compat.h"

namespace pp {

absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda") return DeviceKind::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("device '", name, "' is not a known device; valid: cpu, cuda"));
}

std::string DeviceKindName(DeviceKind kind) { return kind == DeviceKind::kCuda ? "cuda" : "cpu"; }

int VisibleCudaDevices() { return at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0; }

absl::StatusOr<c10::Device> DeviceForLocalRank(DeviceKind kind, int local_rank,
                                               int ranks_per_device) {
  if (local_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("local rank ", local_rank, " must be >= 0"));
  }
  if (ranks_per_device < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.ranks_per_device = ", ranks_per_device, " must be >= 1 (1: a GPU per rank)"));
  }
  if (kind == DeviceKind::kCpu) {
    if (ranks_per_device > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("parallelism.ranks_per_device = ", ranks_per_device,
                       " places ranks on GPUs and needs --device=cuda; on the CPU leave it at 1"));
    }
    return c10::Device(c10::DeviceType::CPU);
  }
  const int index = local_rank / ranks_per_device;
  const std::string device = absl::StrCat("cuda:", index);
  if (!torch_compat::BuiltWithCuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device, " (--device=cuda, local rank ", local_rank,
                     ") is not available: this binary's LibTorch ", torch_compat::LibTorchVersion(),
                     " is built without CUDA; build with --config=cuda, or use --device=cpu"));
  }
  const int gpus = VisibleCudaDevices();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string visible_note =
      visible == nullptr ? "" : absl::StrCat(" (CUDA_VISIBLE_DEVICES=\"", visible, "\")");
  if (gpus == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device, " (--device=cuda, local rank ", local_rank,
                     ") is not available: no CUDA GPU is visible to this process", visible_note,
                     "; use --device=cpu"));
  }
  if (index >= gpus) {
    const std::string per_gpu = ranks_per_device == 1 ? "one per local rank is needed"
                                                      : absl::StrCat("one per ", ranks_per_device,
                                                                     " local ranks is needed");
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", device, " (--device=cuda, local rank ", local_rank,
        ") is not available: this node has ", gpus, " visible CUDA GPU", gpus == 1 ? "" : "s",
        visible_note, ", ", per_gpu, "; start at most ", gpus * ranks_per_device,
        " ranks per node (--nproc_per_node), or let ranks share GPUs "
        "(parallelism.ranks_per_device, for tests and small experiments)"));
  }
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace pp
