#include "common/torch_compat.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

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

// Without NCCL in the build the refusal names the build that has it; with it
// (--config=cuda) on a machine without a GPU, ProcessGroupNCCL's own refusal
// comes through. On a GPU machine a one-member NCCL group all-reduces a CUDA
// tensor next to Gloo's CPU all-reduce on the same group.
TEST(TorchCompatTest, NcclBackendOrANamedRefusal) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto gloo_options = c10d::ProcessGroupGloo::Options::create();
  gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto group = NewGlooProcessGroup(store, 0, 1, gloo_options);
  const bool has_gpu = at::hasCUDA();
  if (!BuiltWithCuda() || !has_gpu) {
    try {
      AddNcclBackend(group, c10::make_intrusive<c10d::PrefixStore>("nccl", store), 0, 1,
                     std::chrono::seconds(10));
      ADD_FAILURE() << "AddNcclBackend accepted a build or machine without NCCL or a GPU";
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      if (!BuiltWithCuda()) {
        EXPECT_NE(message.find("build with --config=cuda"), std::string::npos) << message;
        EXPECT_NE(message.find(LibTorchVersion()), std::string::npos) << message;
      } else {
        EXPECT_NE(message.find("GPU"), std::string::npos) << message;
      }
    }
    if (BuiltWithCuda()) GTEST_SKIP() << "no CUDA GPU visible: the NCCL all-reduce needs one";
    return;
  }
  AddNcclBackend(group, c10::make_intrusive<c10d::PrefixStore>("nccl", store), 0, 1,
                 std::chrono::seconds(60));
  std::vector<at::Tensor> on_gpu = {at::full({4}, 3.0, at::device(at::kCUDA))};
  ASSERT_TRUE(group->allreduce(on_gpu)->wait(std::chrono::seconds(60)));
  std::vector<at::Tensor> on_cpu = {at::full({4}, 2.0)};
  ASSERT_TRUE(group->allreduce(on_cpu)->wait(std::chrono::seconds(60)));
  EXPECT_EQ(on_gpu[0].sum().item<double>(), 12.0);
  EXPECT_EQ(on_cpu[0].sum().item<double>(), 8.0);
}

// The edge shares ownership of a node found as a raw pointer: the node
// outlives the tensor whose graph held it, and a backward run through the
// edge reaches the node's inputs.
TEST(TorchCompatTest, OwningEdgeKeepsANodeAlive) {
  torch::Tensor x = torch::ones({3}, torch::requires_grad());
  torch::autograd::Edge edge;
  {
    torch::Tensor y = (x * 2).sum();
    torch::autograd::Node* node = y.grad_fn().get();
    ASSERT_NE(node, nullptr);
    edge = OwningEdge(node, 0);
    EXPECT_EQ(edge.function.get(), node);
    EXPECT_EQ(edge.input_nr, 0u);
  }
  // y is gone; only the edge holds its SumBackward node now.
  ASSERT_TRUE(edge.is_valid());
  EXPECT_EQ(edge.function->name(), "SumBackward0");
  torch::autograd::Engine::get_default_engine().execute(
      {edge}, {torch::ones({})}, /*keep_graph=*/false, /*create_graph=*/false,
      /*accumulate_grad=*/true);
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({3}, 2.0)));
}

}  // namespace
}  // namespace pp::torch_compat
