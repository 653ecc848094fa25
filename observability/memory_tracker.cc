#include "observability/memory_tracker.h"

#include <cstring>
#include <mutex>

#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"

namespace pp {
namespace {

// In front of every tracked allocation's data.
struct Header {
  size_t size;
  void* inner_context;
  c10::DeleterFnPtr inner_deleter;
  std::atomic<int64_t>* current;
};

// A multiple of LibTorch's alignment, so the data after the header keeps the
// alignment the inner allocator gave the block.
constexpr size_t kHeaderBytes =
    (sizeof(Header) + c10::gAlignment - 1) / c10::gAlignment * c10::gAlignment;

// Raises `peak` to `value` unless another thread raised it further.
void RaisePeak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// Lives forever: storage allocated through it may be freed at exit, after any
// static destructor would have run.
std::atomic<TrackingAllocator*> global_tracker{nullptr};
std::mutex install_mutex;  // serializes installs only; reads are lock-free

}  // namespace

TrackingAllocator::TrackingAllocator(c10::Allocator* inner) : inner_(inner) {
  TORCH_CHECK(inner != nullptr, "TrackingAllocator needs an allocator to forward to");
}

c10::DataPtr TrackingAllocator::allocate(size_t n) const { return Allocate(n); }
c10::DataPtr TrackingAllocator::allocate(size_t n) { return Allocate(n); }

c10::DeleterFnPtr TrackingAllocator::raw_deleter() const { return &TrackingAllocator::Delete; }

void TrackingAllocator::copy_data(void* dest, const void* src, size_t count) const {
  std::memcpy(dest, src, count);
}

c10::DataPtr TrackingAllocator::Allocate(size_t n) const {
  const c10::Device cpu(c10::DeviceType::CPU);
  // Like LibTorch's own allocator: no block for an empty tensor, and nothing
  // to count.
  if (n == 0) return c10::DataPtr(nullptr, nullptr, &TrackingAllocator::Delete, cpu);
  c10::DataPtr block = inner_->allocate(n + kHeaderBytes);
  char* base = static_cast<char*>(block.get());
  Header* header = reinterpret_cast<Header*>(base);
  header->size = n;
  header->inner_deleter = block.get_deleter();
  header->inner_context = block.release_context();
  header->current = &current_;
  RaisePeak(peak_, current_.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) +
                       static_cast<int64_t>(n));
  void* data = base + kHeaderBytes;
  // Context == data: what the raw interface and is_simple_data_ptr expect.
  return c10::DataPtr(data, data, &TrackingAllocator::Delete, cpu);
}

void TrackingAllocator::Delete(void* data) {
  if (data == nullptr) return;
  Header* header = reinterpret_cast<Header*>(static_cast<char*>(data) - kHeaderBytes);
  header->current->fetch_sub(static_cast<int64_t>(header->size), std::memory_order_relaxed);
  header->inner_deleter(header->inner_context);
}

MemoryStats TrackingAllocator::stats() const {
  MemoryStats s;
  s.current_bytes = current_.load(std::memory_order_relaxed);
  s.peak_bytes = peak_.load(std::memory_order_relaxed);
  return s;
}

void TrackingAllocator::ResetPeak() {
  peak_.store(current_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

absl::Status InstallCpuMemoryTracking() {
  std::lock_guard<std::mutex> lock(install_mutex);
  if (global_tracker.load() != nullptr) return absl::OkStatus();
  c10::Allocator* current = c10::GetCPUAllocator();
  auto* tracker = new TrackingAllocator(current);
  // The highest priority: whatever allocator LibTorch uses now keeps doing the
  // work behind the tracker, and a later lower-priority registration cannot
  // silently take the counting away.
  c10::SetCPUAllocator(tracker, /*priority=*/255);
  if (c10::GetCPUAllocator() != tracker) {
    delete tracker;
    return absl::FailedPreconditionError(
        "LibTorch kept its CPU allocator: another one is registered with priority 255; CPU "
        "memory cannot be tracked");
  }
  global_tracker.store(tracker);
  return absl::OkStatus();
}

bool CpuMemoryTrackingInstalled() { return global_tracker.load() != nullptr; }

MemoryStats CpuMemoryStats() {
  TrackingAllocator* tracker = global_tracker.load();
  return tracker == nullptr ? MemoryStats{} : tracker->stats();
}

void ResetCpuPeakMemory() {
  if (TrackingAllocator* tracker = global_tracker.load()) tracker->ResetPeak();
}

absl::StatusOr<MemoryStats> MemoryStatsFor(const c10::Device& device) {
  switch (device.type()) {
    case c10::DeviceType::CPU:
      if (!CpuMemoryTrackingInstalled()) {
        return absl::FailedPreconditionError(
            "CPU memory is not tracked: call InstallCpuMemoryTracking() before the model is "
            "built");
      }
      return CpuMemoryStats();
    case c10::DeviceType::CUDA:
      return absl::UnimplementedError(
          absl::StrCat("memory statistics for ", device.str(),
                       " are not wired yet: they will come from "
                       "c10::cuda::CUDACachingAllocator::getDeviceStats once pipe's GPU path "
                       "lands; CPU memory is tracked"));
    default:
      return absl::UnimplementedError(
          absl::StrCat("no memory statistics for device ", device.str(), "; supported: cpu"));
  }
}

absl::Status ResetPeakMemoryFor(const c10::Device& device) {
  // Only CPU gets past MemoryStatsFor today; CUDA will reset its own peak here.
  absl::StatusOr<MemoryStats> stats = MemoryStatsFor(device);
  if (!stats.ok()) return stats.status();
  ResetCpuPeakMemory();
  return absl::OkStatus();
}

}  // namespace pp
