#include "pipeline/autograd/split_backward.h"

#include <atomic>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Identity whose backward counts its calls: put on the input path, it tells
// how often that part of the backward ran.
std::atomic<int> g_identity_backward_calls{0};
struct CountingIdentity : public torch::autograd::Function<CountingIdentity> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x) { return x.clone(); }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    g_identity_backward_calls++;
    return {grads[0]};
  }
};

// y = x * w (element-wise, w broadcast): a join node whose backward records
// which of its gradients each call was asked for.
std::vector<std::pair<bool, bool>> g_scale_calls;
struct RecordingScale : public torch::autograd::Function<RecordingScale> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor w) {
    ctx->save_for_backward({x, w});
    return x * w;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool want_x = ctx->needs_input_grad(0);
    const bool want_w = ctx->needs_input_grad(1);
    g_scale_calls.emplace_back(want_x, want_w);
    auto saved = ctx->get_saved_variables();
    torch::Tensor gx, gw;
    if (want_x) gx = grads[0] * saved[1];
    if (want_w) gw = (grads[0] * saved[0]).sum(0);
    return {gx, gw};
  }
};

struct Net {
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::Tensor scale;
  explicit Net(int d) {
    torch::manual_seed(7);
    l1 = torch::nn::Linear(d, 2 * d);
    l2 = torch::nn::Linear(2 * d, d);
    norm = torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}));
    scale = torch::randn({d}).requires_grad_(true);
  }
  std::vector<torch::Tensor> params() {
    std::vector<torch::Tensor> p = l1->parameters();
    for (auto& t : l2->parameters()) p.push_back(t);
    for (auto& t : norm->parameters()) p.push_back(t);
    p.push_back(scale);
    return p;
  }
  void zero() {
    for (auto& p : params()) p.mutable_grad().reset();
  }
  // Two outputs; l1's weight is used twice (a tie inside the stage).
  std::vector<torch::Tensor> operator()(const torch::Tensor& x) {
    torch::Tensor h = CountingIdentity::apply(x);
    h = torch::gelu(l1(h));
    h = CountingIdentity::apply(h);
    torch::Tensor y = norm(l2(h));
    y = RecordingScale::apply(y, scale);
    torch::Tensor tied = torch::matmul(y, l1->weight.t());  // uses l1.weight again
    return {y, tied.sum(1, true)};
  }
};

TEST(SplitBackwardTest, InputThenWeightEqualsFullBackward) {
  const int d = 6;
  Net net(d);
  torch::Tensor x0 = torch::randn({4, d});
  std::vector<torch::Tensor> g = {torch::randn({4, d}), torch::randn({4, 1})};

  // Reference: one full backward.
  torch::Tensor x = x0.clone().requires_grad_(true);
  auto out = net(x);
  torch::autograd::backward(out, g);
  torch::Tensor ref_x = x.grad().clone();
  std::vector<torch::Tensor> ref;
  for (auto& p : net.params()) ref.push_back(p.grad().clone());
  net.zero();

  g_identity_backward_calls = 0;
  g_scale_calls.clear();
  torch::Tensor x2 = x0.clone().requires_grad_(true);
  BackwardInputResult r = BackwardInput(net(x2), g, {x2});
  ASSERT_EQ(r.input_grads.size(), 1u);
  EXPECT_TRUE(torch::allclose(r.input_grads[0], ref_x, 1e-6, 1e-6));
  EXPECT_FALSE(x2.grad().defined()) << "I returns input grads, it does not accumulate them";
  for (auto& p : net.params()) {
    EXPECT_FALSE(p.grad().defined()) << "I computed a weight gradient";
  }
  EXPECT_EQ(g_identity_backward_calls, 2);
  ASSERT_EQ(g_scale_calls.size(), 1u);
  EXPECT_EQ(g_scale_calls[0], std::make_pair(true, false));
  EXPECT_FALSE(r.weight.empty());

  r.weight.Run();
  EXPECT_TRUE(r.weight.empty());
  // Nothing on the input path ran again; the join node ran for its weight.
  EXPECT_EQ(g_identity_backward_calls, 2);
  ASSERT_EQ(g_scale_calls.size(), 2u);
  EXPECT_EQ(g_scale_calls[1], std::make_pair(false, true));
  EXPECT_FALSE(x2.grad().defined());
  auto params = net.params();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined()) << i;
    EXPECT_TRUE(torch::allclose(params[i].grad(), ref[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

TEST(SplitBackwardTest, WeightGradientsAccumulateAcrossMicroBatches) {
  const int d = 5;
  Net net(d);
  std::vector<torch::Tensor> xs = {torch::randn({3, d}), torch::randn({3, d})};
  std::vector<torch::Tensor> g = {torch::ones({3, d}), torch::ones({3, 1})};
  for (auto& x0 : xs) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::autograd::backward(net(x), g);
  }
  std::vector<torch::Tensor> ref;
  for (auto& p : net.params()) ref.push_back(p.grad().clone());
  net.zero();
  // I(0), I(1), W(1), W(0): the order of a zero-bubble schedule.
  std::vector<BackwardInputResult> pending;
  for (auto& x0 : xs) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    pending.push_back(BackwardInput(net(x), g, {x}));
  }
  pending[1].weight.Run();
  pending[0].weight.Run();
  auto params = net.params();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i].grad(), ref[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

TEST(SplitBackwardTest, NoInputsLeavesEverythingToWeightAndLossRoot) {
  Net net(4);
  torch::Tensor x = torch::randn({2, 4});  // no grad: a first stage's tokens
  torch::Tensor loss = net(x)[0].pow(2).sum();
  torch::autograd::backward({loss});
  std::vector<torch::Tensor> ref;
  for (auto& p : net.params()) ref.push_back(p.grad().clone());
  net.zero();
  BackwardInputResult r = BackwardInput({net(x)[0].pow(2).sum()}, {torch::Tensor()}, {});
  EXPECT_TRUE(r.input_grads.empty());
  for (auto& p : net.params()) EXPECT_FALSE(p.grad().defined());
  r.weight.Run();
  auto params = net.params();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i].grad(), ref[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

// Several inputs (one reached by no root), a root that reaches no input
// (parameters only), and shared sub-graphs: the graph walk must still find
// every join node once and leave the parameter-only root to W.
TEST(SplitBackwardTest, ManyInputsAndARootThatReachesNoInput) {
  const int d = 4;
  Net net(d);
  torch::Tensor x0 = torch::randn({3, d}), z0 = torch::randn({3, d}), u0 = torch::randn({3, d});
  auto roots = [&](const torch::Tensor& x, const torch::Tensor& z, const torch::Tensor& u) {
    std::vector<torch::Tensor> out = net(x * z + z);
    (void)u;  // an input no root depends on
    return std::vector<torch::Tensor>{out[0], out[1], net.scale.pow(2).sum()};
  };
  std::vector<torch::Tensor> g = {torch::randn({3, d}), torch::randn({3, 1}), torch::Tensor()};
  std::vector<torch::Tensor> g_full = {g[0], g[1], torch::ones({})};

  torch::Tensor x = x0.clone().requires_grad_(true), z = z0.clone().requires_grad_(true),
                u = u0.clone().requires_grad_(true);
  torch::autograd::backward(roots(x, z, u), g_full);
  std::vector<torch::Tensor> ref;
  for (auto& p : net.params()) ref.push_back(p.grad().clone());
  net.zero();

  torch::Tensor x2 = x0.clone().requires_grad_(true), z2 = z0.clone().requires_grad_(true),
                u2 = u0.clone().requires_grad_(true);
  g_scale_calls.clear();
  BackwardInputResult r = BackwardInput(roots(x2, z2, u2), g, {x2, z2, u2});
  ASSERT_EQ(r.input_grads.size(), 3u);
  EXPECT_TRUE(torch::allclose(r.input_grads[0], x.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(r.input_grads[1], z.grad(), 1e-5, 1e-6));
  EXPECT_FALSE(r.input_grads[2].defined()) << "no root reaches this input";
  EXPECT_FALSE(net.scale.grad().defined()) << "the parameter-only root ran in I";
  r.weight.Run();
  ASSERT_EQ(g_scale_calls.size(), 2u) << "the join node ran other than once in I and once in W";
  auto params = net.params();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined()) << i;
    EXPECT_TRUE(torch::allclose(params[i].grad(), ref[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

TEST(SplitBackwardTest, RunWithTargetsReturnsGradientsWithoutAccumulating) {
  Net net(4);
  torch::Tensor x0 = torch::randn({2, 4});
  torch::Tensor x = x0.clone().requires_grad_(true);
  auto out = net(x);
  std::vector<torch::Tensor> g = {torch::ones({2, 4}), torch::ones({2, 1})};
  torch::autograd::backward(out, g);
  torch::Tensor ref = net.l2->weight.grad().clone();
  net.zero();
  torch::Tensor x2 = x0.clone().requires_grad_(true);
  BackwardInputResult r = BackwardInput(net(x2), g, {x2});
  std::vector<torch::Tensor> got = r.weight.Run({net.l2->weight});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(torch::allclose(got[0], ref, 1e-5, 1e-6));
  EXPECT_FALSE(net.l2->weight.grad().defined());
}

TEST(SplitBackwardTest, RejectsInputThatNeedsNoGrad) {
  torch::Tensor x = torch::randn({2});
  torch::Tensor w = torch::randn({2}, torch::requires_grad());
  EXPECT_THROW(BackwardInput({(x * w).sum()}, {torch::Tensor()}, {x}), c10::Error);
}

}  // namespace
}  // namespace pp
