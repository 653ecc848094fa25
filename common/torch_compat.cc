#include "common/torch_compat.h"

#include <cstdlib>
#include <mutex>

#include <c10/util/Exception.h>
#include <c10/util/string_utils.h>
#include <torch/version.h>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

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
  // c10d's flight recorder (2.x) is one process-wide buffer that Gloo groups
  // write to without a lock that covers several groups used from several
  // threads: equivalence_test (ranks as threads) segfaulted in
  // FlightRecorder::recordWithResetEnabled. It is read once, at first use, from
  // TORCH_FR_BUFFER_SIZE; off unless the user set it.
  static std::once_flag flight_recorder_off;
  std::call_once(flight_recorder_off, [] { setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0); });
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
#else
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
#endif
}

void AddNcclBackend(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout) {
#if TORCH_VERSION_MAJOR >= 2 && defined(USE_C10D_NCCL)
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, backend);
#else
  (void)group;
  (void)store;
  (void)rank;
  (void)size;
  (void)timeout;
  TORCH_CHECK(false, "c10d's NCCL backend is not in this build (LibTorch ", TORCH_VERSION,
              BuiltWithCuda() ? "" : ", CPU only",
              "); build with --config=cuda (LibTorch 2.x with CUDA and NCCL)");
#endif
}

namespace {

// Chosen by the type of Edge::function, not by version numbers: the overload
// for the other ownership is never instantiated.
template <typename N>
std::shared_ptr<N> Own(N* node, std::shared_ptr<N>* /*tag*/) {
  return node->shared_from_this();
}
template <typename N>
c10::intrusive_ptr<N> Own(N* node, c10::intrusive_ptr<N>* /*tag*/) {
  return c10::intrusive_ptr<N>::reclaim_copy(node);
}

}  // namespace

torch::autograd::Edge OwningEdge(torch::autograd::Node* node, uint32_t input_nr) {
  using Pointer = decltype(torch::autograd::Edge::function);
  return torch::autograd::Edge(Own(node, static_cast<Pointer*>(nullptr)), input_nr);
}

OptimizerStateKey OptimizerStateKeyOf(const at::Tensor& param) {
#if TORCH_VERSION_MAJOR >= 2
  return param.unsafeGetTensorImpl();
#else
  return c10::guts::to_string(param.unsafeGetTensorImpl());
#endif
}

}  // namespace pp::torch_compat
