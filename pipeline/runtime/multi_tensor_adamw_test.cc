#include "pipeline/runtime/multi_tensor_adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/torch_compat.h"
#include "pipeline/runtime/grad_sync.h"
#include "pipeline/runtime/mixed_precision.h"
#include "pipeline/runtime/optimizer.h"

namespace pp {
namespace {

// Shapes of a small transformer's parameters and then some: element counts
// that are and are not multiples of the vector width (8 and 16 floats), a
// scalar, an empty tensor, a non-contiguous leading dimension of 1.
std::vector<std::vector<int64_t>> Shapes() {
  std::vector<std::vector<int64_t>> shapes = {{300, 16}, {16}, {}, {0}, {1, 7}, {48, 16}, {33}};
  for (int i = 0; i < 24; ++i) shapes.push_back({i % 5 + 1, 3 * i + 1});
  return shapes;
}

std::vector<torch::Tensor> MakeParams(uint64_t seed) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  std::vector<torch::Tensor> params;
  for (const auto& shape : Shapes()) {
    params.push_back(torch::randn(shape, gen).requires_grad_());
  }
  return params;
}

struct Setup {
  double weight_decay;
  bool clip;
  bool bf16_masters;
  std::string name;
};

// One run: `optimizer(params)` for 5 steps on the same pseudo-random
// gradients (one parameter gets none on odd steps: AdamW skips it), clipped
// to norm 1 where asked, with an lr that changes between steps (as a
// schedule does). bf16: the parameters are a bf16 model's fp32 masters,
// gradients added into them from bf16 (MasterWeights), as the Trainer does.
template <typename Optimizer>
std::vector<torch::Tensor> Train(const Setup& s, std::vector<torch::Tensor>* states) {
  std::vector<torch::Tensor> model = MakeParams(42);
  std::unique_ptr<MasterWeights> master;
  if (s.bf16_masters) master = std::make_unique<MasterWeights>(model);
  const std::vector<torch::Tensor> params = master ? master->masters() : model;
  Optimizer optimizer(params, torch::optim::AdamWOptions(0.01)
                                  .betas(std::make_tuple(0.9, 0.95))
                                  .eps(1e-8)
                                  .weight_decay(s.weight_decay));
  torch::Generator gen = at::detail::createCPUGenerator(7);
  for (int step = 0; step < 5; ++step) {
    SetLearningRate(optimizer, 0.01 / (step + 1));
    optimizer.zero_grad();
    for (size_t i = 0; i < model.size(); ++i) {
      if (i == 4 && step % 2 == 1) continue;
      torch::Tensor g = torch::randn(model[i].sizes(), gen) * static_cast<double>(i + 1);
      model[i].mutable_grad() = g.to(model[i].dtype());
    }
    if (master) master->AccumulateGrads();
    if (s.clip) {
      double sumsq = 0;
      for (const torch::Tensor& p : params) {
        if (p.grad().defined()) sumsq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
      }
      ClipGradsToNorm(params, std::sqrt(sumsq), 1.0);
    }
    optimizer.step();
  }
  for (const torch::Tensor& p : params) {
    auto& state = static_cast<torch::optim::AdamWParamState&>(
        *optimizer.state().at(torch_compat::OptimizerStateKeyOf(p)));
    states->push_back(state.exp_avg());
    states->push_back(state.exp_avg_sq());
    states->push_back(torch::tensor(state.step()));
  }
  return params;
}

class MultiTensorAdamWTest : public ::testing::TestWithParam<Setup> {};

// The covering set: weight decay on / off x clipping on / off, fp32 and bf16
// masters with both on: every branch of the update and both callers' paths.
TEST_P(MultiTensorAdamWTest, BitForBitTorchsAdamW) {
  std::vector<torch::Tensor> want_states, got_states;
  const std::vector<torch::Tensor> want = Train<torch::optim::AdamW>(GetParam(), &want_states);
  const std::vector<torch::Tensor> got = Train<MultiTensorAdamW>(GetParam(), &got_states);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::equal(want[i], got[i]))
        << "parameter " << i << " max abs diff " << (want[i] - got[i]).abs().max().item<double>();
    EXPECT_FALSE(torch::equal(want[i], MakeParams(42)[i].to(want[i].dtype())) &&
                 want[i].numel() > 0)
        << "parameter " << i << " never moved";
  }
  ASSERT_EQ(want_states.size(), got_states.size());
  for (size_t i = 0; i < want_states.size(); ++i) {
    EXPECT_TRUE(torch::equal(want_states[i], got_states[i])) << "state " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Setups, MultiTensorAdamWTest,
                         ::testing::Values(Setup{0.0, false, false, "fp32"},
                                           Setup{0.1, false, false, "fp32_decay"},
                                           Setup{0.0, true, false, "fp32_clip"},
                                           Setup{0.1, true, false, "fp32_decay_clip"},
                                           Setup{0.1, true, true, "bf16_masters_decay_clip"}),
                         [](const ::testing::TestParamInfo<Setup>& info) {
                           return info.param.name;
                         });

// MakeOptimizer's "adamw" is this one, so the Trainer and the checkpoints
// (which look for a torch::optim::AdamW) get it.
TEST(MultiTensorAdamWTest, IsWhatMakeOptimizerGives) {
  OptimizerConfig c;
  c.name = "adamw";
  auto optimizer = MakeOptimizer(c, MakeParams(1));
  EXPECT_NE(dynamic_cast<MultiTensorAdamW*>(optimizer.get()), nullptr);
  EXPECT_NE(dynamic_cast<torch::optim::AdamW*>(optimizer.get()), nullptr);
}

}  // namespace
}  // namespace pp
