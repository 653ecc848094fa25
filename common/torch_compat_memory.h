// The allocation hook behind the profiler's memory option
// (c10::MemoryReportingInfoBase), written once for every LibTorch version: the
// part of the LibTorch differences (common/torch_compat.h) that layer memory
// measurement needs (pipeline/partition/layer_memory.h), in a target of its
// own so that a change here rebuilds only its users.
//
// reportMemoryUsage's totals are int64_t in 1.13 and size_t in the 2.x
// versions pipe supports (2.11, 2.15).
#ifndef COMMON_TORCH_COMPAT_MEMORY_H_
#define COMMON_TORCH_COMPAT_MEMORY_H_

#include <cstddef>
#include <cstdint>

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <torch/version.h>

namespace pp::torch_compat {

// Subclasses define OnAllocation (alloc_size < 0 for a free) and
// memoryProfilingEnabled. Thread-safety: LibTorch calls the hook from every
// thread that allocates; OnAllocation must be thread-safe.
class MemoryReporterBase : public c10::MemoryReportingInfoBase {
 public:
  virtual void OnAllocation(int64_t alloc_size) = 0;

#if TORCH_VERSION_MAJOR >= 2
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, size_t /*total_allocated*/,
                         size_t /*total_reserved*/, c10::Device /*device*/) override {
    OnAllocation(alloc_size);
  }
#else
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, int64_t /*total_allocated*/,
                         int64_t /*total_reserved*/, c10::Device /*device*/) override {
    OnAllocation(alloc_size);
  }
#endif
};

}  // namespace pp::torch_compat

#endif  // COMMON_TORCH_COMPAT_MEMORY_H_
