#include "observability/memory_tracker.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include "gtest/gtest.h"

namespace pp {
namespace {

// A private tracker in front of LibTorch's default allocator: exact figures,
// independent of anything else the process allocates.
TEST(TrackingAllocatorTest, CurrentAndPeakFollowAllocationsOfKnownSize) {
  TrackingAllocator tracker(c10::GetDefaultCPUAllocator());
  c10::Allocator& allocator = tracker;
  EXPECT_EQ(tracker.stats().current_bytes, 0);
  {
    c10::DataPtr a = allocator.allocate(1000);
    EXPECT_EQ(tracker.stats().current_bytes, 1000);
    EXPECT_EQ(tracker.stats().peak_bytes, 1000);
    c10::DataPtr b = allocator.allocate(500);
    EXPECT_EQ(tracker.stats().current_bytes, 1500);
    EXPECT_EQ(tracker.stats().peak_bytes, 1500);
    // Usable, writable memory, aligned like LibTorch's own.
    std::memset(a.get(), 0xab, 1000);
    std::memset(b.get(), 0xcd, 500);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % c10::gAlignment, 0u);
    EXPECT_EQ(a.get(), a.get_context());
    a.clear();
    EXPECT_EQ(tracker.stats().current_bytes, 500);
    EXPECT_EQ(tracker.stats().peak_bytes, 1500);
    tracker.ResetPeak();
    EXPECT_EQ(tracker.stats().peak_bytes, 500);
    c10::DataPtr c = allocator.allocate(200);
    EXPECT_EQ(tracker.stats().peak_bytes, 700);
  }
  EXPECT_EQ(tracker.stats().current_bytes, 0);
  EXPECT_EQ(tracker.stats().peak_bytes, 700);
}

TEST(TrackingAllocatorTest, EmptyAllocationsCountNothingAndRawInterfaceWorks) {
  TrackingAllocator tracker(c10::GetDefaultCPUAllocator());
  c10::Allocator& allocator = tracker;
  c10::DataPtr empty = allocator.allocate(0);
  EXPECT_EQ(empty.get(), nullptr);
  EXPECT_EQ(tracker.stats().current_bytes, 0);
  empty.clear();

  ASSERT_NE(allocator.raw_deleter(), nullptr);
  void* raw = allocator.raw_allocate(4096);
  EXPECT_EQ(tracker.stats().current_bytes, 4096);
  std::memset(raw, 1, 4096);
  allocator.raw_deallocate(raw);
  EXPECT_EQ(tracker.stats().current_bytes, 0);
  EXPECT_EQ(tracker.stats().peak_bytes, 4096);
}

TEST(TrackingAllocatorTest, ThreadSafeUnderConcurrentAllocationAndFree) {
  TrackingAllocator tracker(c10::GetDefaultCPUAllocator());
  constexpr int kThreads = 8;
  constexpr int kRounds = 5000;
  constexpr int kLive = 4;       // allocations each thread holds at once
  constexpr size_t kMax = 4096;  // bytes per allocation at most
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&tracker, t] {
      std::mt19937 rng(t);
      std::uniform_int_distribution<size_t> size(1, kMax);
      std::vector<c10::DataPtr> live(kLive);
      c10::Allocator& allocator = tracker;
      for (int i = 0; i < kRounds; ++i) live[i % kLive] = allocator.allocate(size(rng));
    });
  }
  for (std::thread& t : threads) t.join();
  const MemoryStats s = tracker.stats();
  EXPECT_EQ(s.current_bytes, 0);
  EXPECT_GT(s.peak_bytes, 0);
  // One slot is being replaced at a time: the new block exists before the old
  // one is freed.
  EXPECT_LE(s.peak_bytes, int64_t{kThreads} * (kLive + 1) * static_cast<int64_t>(kMax));
}

// The process-wide install behind LibTorch's CPU allocator: what the runtime
// uses. One test, since the install is permanent and its order matters.
TEST(CpuMemoryTrackingTest, TensorsMoveCurrentAndPeakAndPeakGrowsWithSize) {
  EXPECT_EQ(MemoryStatsFor(c10::Device(c10::kCPU)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  torch::Tensor from_before = torch::ones({1 << 16});

  ASSERT_TRUE(InstallCpuMemoryTracking().ok());
  ASSERT_TRUE(InstallCpuMemoryTracking().ok());  // idempotent
  ASSERT_TRUE(CpuMemoryTrackingInstalled());

  // Storage from before the install is freed by its own allocator: no effect.
  const int64_t base = CpuMemoryStats().current_bytes;
  from_before = torch::Tensor();
  EXPECT_EQ(CpuMemoryStats().current_bytes, base);

  {
    torch::Tensor t = torch::empty({1000}, torch::kFloat);
    EXPECT_EQ(CpuMemoryStats().current_bytes, base + 4000);
    torch::Tensor d = torch::empty({10, 10}, torch::kDouble);
    EXPECT_EQ(CpuMemoryStats().current_bytes, base + 4000 + 800);
  }
  EXPECT_EQ(CpuMemoryStats().current_bytes, base);

  // The peak of the same computation grows with its tensors' size: y = x * 2
  // and z = y + 1 both live at the end, next to x.
  int64_t previous_peak = 0;
  for (int64_t n : {int64_t{1} << 10, int64_t{1} << 14, int64_t{1} << 18}) {
    torch::Tensor x = torch::rand({n});
    ResetCpuPeakMemory();
    const int64_t start = CpuMemoryStats().current_bytes;
    {
      torch::Tensor y = x * 2;
      torch::Tensor z = y + 1;
      EXPECT_EQ(CpuMemoryStats().current_bytes, start + 2 * 4 * n);
    }
    const int64_t peak = CpuMemoryStats().peak_bytes - start;
    EXPECT_GE(peak, 2 * 4 * n) << n;
    EXPECT_LE(peak, 2 * 4 * n + 65536) << n;  // no gross over-counting
    EXPECT_GT(peak, previous_peak) << n;
    previous_peak = peak;
  }

  // Autograd: the backward of a matmul chain holds saved activations, which the
  // peak sees.
  torch::Tensor w = torch::randn({256, 256}, torch::requires_grad());
  ResetCpuPeakMemory();
  const int64_t before_forward = CpuMemoryStats().current_bytes;
  torch::Tensor h = torch::randn({64, 256});
  for (int i = 0; i < 4; ++i) h = torch::relu(h.matmul(w));
  h.sum().backward();
  EXPECT_GE(CpuMemoryStats().peak_bytes - before_forward, 4 * 64 * 256 * 4);

  auto via_device = MemoryStatsFor(c10::Device(c10::kCPU));
  ASSERT_TRUE(via_device.ok()) << via_device.status();
  EXPECT_EQ(via_device->current_bytes, CpuMemoryStats().current_bytes);
  EXPECT_TRUE(ResetPeakMemoryFor(c10::Device(c10::kCPU)).ok());
  EXPECT_EQ(CpuMemoryStats().peak_bytes, CpuMemoryStats().current_bytes);
}

TEST(CpuMemoryTrackingTest, CudaIsAClearlyNamedHookForLater) {
  auto cuda = MemoryStatsFor(c10::Device(c10::kCUDA, 1));
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(cuda.status().message().find("cuda:1"), std::string::npos) << cuda.status();
  EXPECT_NE(cuda.status().message().find("CUDACachingAllocator"), std::string::npos);
  EXPECT_EQ(ResetPeakMemoryFor(c10::Device(c10::kCUDA, 0)).code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace pp
