// The one place in pipe that knows which LibTorch it is built against.
//
// pipe builds against Debian's LibTorch 1.13 (default) and the pinned
// LibTorch 2.x (--config=torch2, --config=cuda; third_party/torch/repo.bzl).
// Where their C++ APIs differ, callers go through the functions here instead
// of testing versions themselves: no other file compares TORCH_VERSION_*.
//
// Differences handled here:
//   - c10d: in 1.13 ProcessGroupGloo *is* a c10d::ProcessGroup; in 2.x it is a
//     c10d::Backend that a ProcessGroup dispatches to per device type.
//   - c10d's NCCL backend exists only in a CUDA build of 2.x (--config=cuda);
//     a 2.x ProcessGroup can hold it beside Gloo, one backend per device type.
//   - c10::Allocator::allocate is const up to 2.2 and non-const from 2.3, which
//     also adds the pure virtual copy_data.
//   - torch::optim::Optimizer::state() is keyed by the parameter's TensorImpl
//     address printed as a string in 1.13, by the address itself in 2.x.
//   - PP_C10D_HAS_BACKENDS (1 in 2.x, 0 in 1.13): whether c10d::Backend and
//     ProcessGroup::setBackend exist, so that pipe can add a backend of its
//     own for one device type (topology/host_staged_backend.h).
//   - autograd graph nodes (torch::autograd::Node) are owned through
//     std::shared_ptr up to 2.11 and through c10::intrusive_ptr in 2.15, so an
//     Edge that must own a node it found as a raw pointer is made differently.
#ifndef COMMON_TORCH_COMPAT_H_
#define COMMON_TORCH_COMPAT_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include <c10/core/Allocator.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#if TORCH_VERSION_MAJOR >= 2
#define PP_C10D_HAS_BACKENDS 1
#else
#define PP_C10D_HAS_BACKENDS 0
#endif

namespace pp::torch_compat {

// "1.13.0", "2.11.0": the LibTorch headers this binary was compiled with.
std::string LibTorchVersion();

// The major version (1 or 2), for messages and metadata only.
int LibTorchMajorVersion();

// True in a build linked with LibTorch's CUDA libraries (--config=cuda): c10d's
// NCCL backend is compiled in. Says nothing about whether a GPU is present.
bool BuiltWithCuda();

// A process group whose CPU collectives and p2p run on a new Gloo backend.
// The constructor meets the other members through `store` and throws
// (c10::Error / std::exception) when they do not arrive within the options'
// timeout, as ProcessGroupGloo's does.
c10::intrusive_ptr<c10d::ProcessGroup> NewGlooProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& options);

// Adds c10d's NCCL backend for CUDA tensors to `group` (made by
// NewGlooProcessGroup, which keeps Gloo for CPU tensors): collectives and p2p on
// the group then run on NCCL or Gloo by their tensors' device. NCCL meets the
// other members through `store` (give it a prefix of its own) when it first
// communicates; `timeout` bounds its operations. Throws c10::Error when this
// LibTorch has no NCCL (1.13; 2.x built for CPU: --config=torch2), naming the
// build that has it, and when ProcessGroupNCCL refuses (no GPU visible).
void AddNcclBackend(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout);

// A c10::Allocator written once for every LibTorch version: subclasses define
// Allocate (the contract of c10::Allocator::allocate) and raw_deleter.
class AllocatorBase : public c10::Allocator {
 public:
  virtual c10::DataPtr Allocate(size_t n) const = 0;

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return Allocate(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return Allocate(n); }
#endif
};

// The key of `param`'s entry in torch::optim::Optimizer::state().
using OptimizerStateKey =
    typename std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
OptimizerStateKey OptimizerStateKeyOf(const at::Tensor& param);

// An autograd edge to input `input_nr` of `node` that shares ownership of
// the node (split backward's graph surgery holds nodes it found by walking
// the graph as raw pointers).
// REQUIRES: `node` is alive (owned by some graph).
torch::autograd::Edge OwningEdge(torch::autograd::Node* node, uint32_t input_nr);

}  // namespace pp::torch_compat

#endif  // COMMON_TORCH_COMPAT_H_
