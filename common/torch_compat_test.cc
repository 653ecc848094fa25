#include "common/torch_compat.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "gtest/gtest.h"

namespace pp::torch_compat {
namespace {

TEST(TorchCompatTest, VersionIsTheOneCompiledIn) {
  const std::string version = LibTorchVersion();
  EXPECT_EQ(version.substr(0, version.find('.')), std::to_string(LibTorchMajorVersion()));
  EXPECT_TRUE(LibTorchMajorVersion() == 1 || LibTorchMajorVersion() == 2) << version;
#ifdef USE_C10D_NCCL
  EXPECT_TRUE(BuiltWithCuda());
#else
  EXPECT_FALSE(BuiltWithCuda());
#endif
}

// Two members in two threads meet through one store; the group's collectives
// and p2p run on CPU tensors whatever the LibTorch version.
TEST(TorchCompatTest, GlooProcessGroupRunsCollectivesAndP2P) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<double> sums(2), received(2);
  std::vector<std::thread> members;
  for (int rank = 0; rank < 2; ++rank) {
    members.emplace_back([&, rank] {
      auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      auto group = NewGlooProcessGroup(store, rank, 2, options);
      ASSERT_EQ(group->getRank(), rank);
      ASSERT_EQ(group->getSize(), 2);
      std::vector<at::Tensor> value = {at::full({3}, rank + 1.0)};
      ASSERT_TRUE(group->allreduce(value)->wait(std::chrono::seconds(30)));
      sums[rank] = value[0].sum().item<double>();
      std::vector<at::Tensor> message = {at::full({2}, rank == 0 ? 7.0 : 0.0)};
      if (rank == 0) {
        ASSERT_TRUE(group->send(message, 1, 5)->wait(std::chrono::seconds(30)));
      } else {
        ASSERT_TRUE(group->recv(message, 0, 5)->wait(std::chrono::seconds(30)));
      }
      received[rank] = message[0].sum().item<double>();
    });
  }
  for (auto& t : members) t.join();
  EXPECT_EQ(sums[0], 9.0);  // (1 + 2) * 3 elements
  EXPECT_EQ(sums[1], 9.0);
  EXPECT_EQ(received[1], 14.0);
}

TEST(TorchCompatTest, EventTimesAreMicroseconds) {
  namespace profiler = torch::autograd::profiler;
  namespace impl = torch::profiler::impl;
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/false);
  profiler::prepareProfiler(config, {impl::ActivityType::CPU});
  profiler::enableProfiler(config, {impl::ActivityType::CPU});
  const auto before = std::chrono::steady_clock::now();
  at::Tensor a = at::ones({256, 256});
  for (int i = 0; i < 20; ++i) a = at::mm(a, a) / 256;
  const auto elapsed_us = std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::steady_clock::now() - before)
                              .count();
  auto result = profiler::disableProfiler();
  int64_t mm_total_us = 0;
  int mm_count = 0;
  for (const auto& e : result->events()) {
    if (e.name() != "aten::mm") continue;
    ++mm_count;
    EXPECT_GE(EventDurationUs(e), 0);
    EXPECT_GT(EventStartUs(e), 0);
    mm_total_us += EventDurationUs(e);
  }
  EXPECT_EQ(mm_count, 20);
  // In microseconds the mm's add up to at most the wall time around them
  // (nanoseconds would overshoot by 1000x).
  EXPECT_LE(mm_total_us, elapsed_us + 1000);
}

}  // namespace
}  // namespace pp::torch_compat
