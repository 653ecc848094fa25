#include "common/torch_compat.h"

#include <c10/util/string_utils.h>
#include <torch/version.h>

namespace pp::torch_compat {

std::string LibTorchVersion() { return TORCH_VERSION; }

int LibTorchMajorVersion() { return TORCH_VERSION_MAJOR; }

bool BuiltWithCuda() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> NewGlooProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& options) {
#if TORCH_VERSION_MAJOR >= 2
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
#else
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
#endif
}

int64_t EventStartUs(const torch::autograd::profiler::KinetoEvent& event) {
#if TORCH_VERSION_MAJOR >= 2
  return static_cast<int64_t>(event.startNs() / 1000);
#else
  return static_cast<int64_t>(event.startUs());
#endif
}

int64_t EventDurationUs(const torch::autograd::profiler::KinetoEvent& event) {
#if TORCH_VERSION_MAJOR >= 2
  return static_cast<int64_t>(event.durationNs() / 1000);
#else
  return static_cast<int64_t>(event.durationUs());
#endif
}

OptimizerStateKey OptimizerStateKeyOf(const at::Tensor& param) {
#if TORCH_VERSION_MAJOR >= 2
  return param.unsafeGetTensorImpl();
#else
  return c10::guts::to_string(param.unsafeGetTensorImpl());
#endif
}

}  // namespace pp::torch_compat
