// Memory per rank: how many bytes of tensor storage a process holds now and at
// its peak. On CPU a tracking allocator sits in front of LibTorch's CPU
// allocator (c10::SetCPUAllocator) and counts every allocation's size with
// atomics; on CUDA (later) the numbers will come from the caching allocator's
// own statistics, behind the same MemoryStatsFor(device).
//
//   PP_RETURN_IF_ERROR(InstallCpuMemoryTracking());   // first thing in main()
//   ResetCpuPeakMemory();                              // at the start of a step
//   ... step ...
//   MemoryStats m = CpuMemoryStats();                  // m.peak_bytes: the step's peak
//
// What is counted: LibTorch CPU storage allocated after the install (tensors,
// autograd buffers, optimizer state, receive buffers). Not counted: storage
// allocated before it, memory LibTorch does not allocate (from_blob, mmap'd
// files), and non-tensor heap (Gloo's buffers, std containers). With several
// ranks as threads of one process the figures are the process's, not a rank's.
#ifndef OBSERVABILITY_MEMORY_TRACKER_H_
#define OBSERVABILITY_MEMORY_TRACKER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pp {

struct MemoryStats {
  int64_t current_bytes = 0;  // in live allocations
  int64_t peak_bytes = 0;     // max of current_bytes since the install or the last reset
};

// Counts the bytes that pass through it, then forwards to `inner`, which does
// the real work. Thread-safe and lock-free: one atomic add per allocation and
// per free, plus a compare-and-swap when the peak rises. Each allocation
// carries a small header in front of its data (the size, the inner allocator's
// deleter and context), so freeing needs no lookup and the raw interface
// (raw_allocate / raw_deallocate) works as with LibTorch's own allocator.
// Must outlive every allocation made through it (the global one never dies).
class TrackingAllocator final : public c10::Allocator {
 public:
  // REQUIRES: `inner` outlives this allocator and allocates CPU memory.
  explicit TrackingAllocator(c10::Allocator* inner);
  TrackingAllocator(const TrackingAllocator&) = delete;
  TrackingAllocator& operator=(const TrackingAllocator&) = delete;

  // c10::Allocator's interface differs across LibTorch versions: 1.13 declares
  // allocate() const, later 2.x releases non-const, and 2.x adds the pure
  // virtual copy_data. Defining both allocate overloads and copy_data makes this
  // class implement whichever the headers declare, with no version switch.
  // (No `override` on them, since only one allocate overrides; clang wants
  // all or none.)
  c10::DataPtr allocate(size_t n) const;
  c10::DataPtr allocate(size_t n);
  c10::DeleterFnPtr raw_deleter() const;
  void copy_data(void* dest, const void* src, size_t count) const;

  MemoryStats stats() const;
  // Sets the peak to the current value. A concurrent allocation may be missed
  // by the new peak (racing with it is harmless otherwise).
  void ResetPeak();

 private:
  c10::DataPtr Allocate(size_t n) const;
  static void Delete(void* data);

  c10::Allocator* const inner_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
};

// Puts a process-wide TrackingAllocator in front of LibTorch's current CPU
// allocator. Idempotent and thread-safe; permanent (allocations made through
// it may outlive any scope). FailedPrecondition if LibTorch keeps another
// allocator (one registered with a higher priority).
absl::Status InstallCpuMemoryTracking();
bool CpuMemoryTrackingInstalled();

// The process's CPU figures; all zero before the install.
MemoryStats CpuMemoryStats();
// No-op before the install.
void ResetCpuPeakMemory();

// The hook the runtime calls for its device. CPU: the tracking allocator's
// figures (FailedPrecondition before InstallCpuMemoryTracking). CUDA:
// Unimplemented for now; it will read
// c10::cuda::CUDACachingAllocator::getDeviceStats(index).allocated_bytes
// (aggregate current and peak; resetPeakStats to reset) once the GPU path
// lands, needing no install. Other devices: Unimplemented naming the device.
absl::StatusOr<MemoryStats> MemoryStatsFor(const c10::Device& device);
absl::Status ResetPeakMemoryFor(const c10::Device& device);

}  // namespace pp

#endif  // OBSERVABILITY_MEMORY_TRACKER_H_
