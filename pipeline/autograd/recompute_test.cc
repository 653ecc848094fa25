#include "pipeline/autograd/recompute.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "pipeline/autograd/split_backward.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/testing/mlp_block.h"
#include "topology/device.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

constexpr uint64_t kSeed = 1234;

std::vector<torch::Tensor> ParametersOf(const std::vector<Layer>& layers) {
  std::vector<torch::Tensor> params;
  for (const Layer& layer : layers) {
    for (const torch::Tensor& p : layer->parameters()) params.push_back(p);
  }
  return params;
}

struct StepResult {
  Activations outputs;
  torch::Tensor input_grad;                // Undefined when the input needs none.
  std::vector<torch::Tensor> param_grads;  // Undefined entries: no gradient.
  torch::Tensor rng_after;                 // Numbers drawn after the step.
};

// One forward + backward of `layers` from a freshly seeded generator, with the
// range run plainly or checkpointed. The loss weighs each output element
// differently so that every gradient entry matters.
StepResult Step(const std::vector<Layer>& layers, Activations inputs, const MicroBatch& batch,
                bool checkpoint) {
  for (torch::Tensor& p : ParametersOf(layers)) p.mutable_grad() = torch::Tensor();
  for (torch::Tensor& t : inputs) {
    if (t.requires_grad()) t.mutable_grad() = torch::Tensor();
  }
  torch::manual_seed(kSeed);
  StepResult result;
  result.outputs =
      checkpoint ? RunLayersWithRecompute(layers, inputs, batch) : RunLayers(layers, inputs, batch);
  const torch::Tensor& out = result.outputs[0];
  torch::Tensor weights = torch::linspace(-1.0, 2.0, out.numel()).reshape(out.sizes());
  (out * weights).sum().backward();
  if (inputs[0].requires_grad()) result.input_grad = inputs[0].grad().clone();
  for (const torch::Tensor& p : ParametersOf(layers)) {
    result.param_grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  }
  result.rng_after = torch::rand({16});
  return result;
}

// Bitwise equality, not closeness: the recompute runs the same kernels on the
// same inputs, so any difference is a bug (e.g. a different dropout mask).
void ExpectBitwiseEqual(const StepResult& plain, const StepResult& ckpt) {
  ASSERT_EQ(plain.outputs.size(), ckpt.outputs.size());
  for (size_t i = 0; i < plain.outputs.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain.outputs[i], ckpt.outputs[i])) << "output " << i;
  }
  ASSERT_EQ(plain.input_grad.defined(), ckpt.input_grad.defined());
  if (plain.input_grad.defined()) {
    EXPECT_TRUE(torch::equal(plain.input_grad, ckpt.input_grad));
  }
  ASSERT_EQ(plain.param_grads.size(), ckpt.param_grads.size());
  for (size_t i = 0; i < plain.param_grads.size(); ++i) {
    ASSERT_TRUE(plain.param_grads[i].defined()) << "parameter " << i;
    ASSERT_TRUE(ckpt.param_grads[i].defined()) << "parameter " << i << " got no gradient";
    EXPECT_TRUE(torch::equal(plain.param_grads[i], ckpt.param_grads[i])) << "parameter " << i;
  }
  EXPECT_TRUE(torch::equal(plain.rng_after, ckpt.rng_after));
}

TEST(RecomputeTest, MlpStackGradientsAreBitwiseEqual) {
  torch::manual_seed(1);
  std::vector<Layer> layers = MakeMlpStack(4, 16, 64, /*dropout=*/0.0);
  torch::Tensor x = torch::randn({8, 16}).requires_grad_(true);
  ExpectBitwiseEqual(Step(layers, {x}, {}, false), Step(layers, {x}, {}, true));
}

TEST(RecomputeTest, DropoutMasksAreReproducedInTrainingMode) {
  torch::manual_seed(2);
  std::vector<Layer> layers = MakeMlpStack(3, 16, 64, /*dropout=*/0.1);
  for (const Layer& layer : layers) layer->train();
  torch::Tensor x = torch::randn({32, 16}).requires_grad_(true);
  StepResult plain = Step(layers, {x}, {}, false);
  ExpectBitwiseEqual(plain, Step(layers, {x}, {}, true));

  // The test would catch a wrong mask: dropout really changes the result.
  for (const Layer& layer : layers) layer->eval();
  StepResult no_dropout = Step(layers, {x}, {}, false);
  EXPECT_FALSE(torch::equal(plain.param_grads[0], no_dropout.param_grads[0]));
}

TEST(RecomputeTest, RandomStreamAfterTheStepIsUndisturbed) {
  torch::manual_seed(3);
  std::vector<Layer> layers = MakeMlpStack(2, 8, 32, /*dropout=*/0.5);
  torch::Tensor x = torch::randn({4, 8}).requires_grad_(true);
  StepResult plain = Step(layers, {x}, {}, false);
  StepResult ckpt = Step(layers, {x}, {}, true);
  EXPECT_TRUE(torch::equal(plain.rng_after, ckpt.rng_after));
  // And the recompute must not simply replay from the seed: the step drew numbers.
  torch::manual_seed(kSeed);
  EXPECT_FALSE(torch::equal(torch::rand({16}), ckpt.rng_after));
}

// In a pipeline other micro-batches' forwards draw random numbers between a
// range's forward and its backward; the recompute must not rewind them.
TEST(RecomputeTest, NumbersDrawnBetweenForwardAndBackwardAreNotReplayed) {
  torch::manual_seed(11);
  std::vector<Layer> layers = MakeMlpStack(2, 8, 32, /*dropout=*/0.5);
  torch::Tensor x = torch::randn({4, 8}).requires_grad_(true);
  std::vector<torch::Tensor> between, after;
  for (bool checkpoint : {false, true}) {
    torch::manual_seed(kSeed);
    Activations out =
        checkpoint ? RunLayersWithRecompute(layers, {x}, {}) : RunLayers(layers, {x}, {});
    between.push_back(torch::rand({16}));
    out[0].sum().backward();
    after.push_back(torch::rand({16}));
  }
  EXPECT_TRUE(torch::equal(between[0], between[1]));
  EXPECT_TRUE(torch::equal(after[0], after[1]));
}

TEST(RecomputeTest, EmbeddingFedIntegerIdsGetsParameterGradients) {
  torch::manual_seed(4);
  std::vector<Layer> layers = {MakeModuleLayer(torch::nn::Embedding(50, 16))};
  for (Layer& block : MakeMlpStack(2, 16, 32, /*dropout=*/0.1)) layers.push_back(block);
  torch::Tensor ids = torch::randint(0, 50, {4, 6}, torch::kLong);
  StepResult plain = Step(layers, {ids}, {}, false);
  StepResult ckpt = Step(layers, {ids}, {}, true);
  ExpectBitwiseEqual(plain, ckpt);
  EXPECT_GT(ckpt.param_grads[0].abs().sum().item<float>(), 0.0f);
}

// Takes {hidden, integer mask}; zeroes masked positions and scales by the
// micro-batch's "scale" side input; returns both tensors.
class MaskedLinear : public LayerImpl {
 public:
  explicit MaskedLinear(int64_t width) : LayerImpl("MaskedLinear") {
    fc_ = register_module("fc", torch::nn::Linear(width, width));
  }
  Activations Forward(const Activations& in, const MicroBatch& batch) override {
    torch::Tensor keep = in[1].unsqueeze(-1).to(torch::kFloat);
    return {torch::tanh(fc_(in[0])) * keep * batch.Get("scale") + in[0], in[1]};
  }

 private:
  torch::nn::Linear fc_{nullptr};
};

TEST(RecomputeTest, TwoTensorPayloadWithIntegerMaskAndSideInput) {
  torch::manual_seed(5);
  std::vector<Layer> layers = {std::make_shared<MaskedLinear>(8),
                               std::make_shared<MaskedLinear>(8)};
  torch::Tensor x = torch::randn({3, 5, 8}).requires_grad_(true);
  torch::Tensor mask = torch::randint(0, 2, {3, 5}, torch::kLong);
  MicroBatch batch{0, {{"scale", torch::full({1}, 0.5)}}};
  StepResult plain = Step(layers, {x, mask}, batch, false);
  StepResult ckpt = Step(layers, {x, mask}, batch, true);
  ExpectBitwiseEqual(plain, ckpt);
  ASSERT_EQ(ckpt.outputs.size(), 2u);
  EXPECT_EQ(ckpt.outputs[1].scalar_type(), torch::kLong);
  EXPECT_FALSE(ckpt.outputs[1].requires_grad());
}

TEST(RecomputeTest, SideInputThatRequiresGradGetsItsGradient) {
  torch::manual_seed(6);
  std::vector<Layer> layers = {std::make_shared<MaskedLinear>(4)};
  torch::Tensor x = torch::randn({2, 3, 4});
  torch::Tensor mask = torch::ones({2, 3}, torch::kLong);
  std::vector<torch::Tensor> grads;
  for (bool checkpoint : {false, true}) {
    torch::Tensor scale = torch::full({1}, 2.0).requires_grad_(true);
    MicroBatch batch{0, {{"scale", scale}}};
    Step(layers, {x, mask}, batch, checkpoint);
    ASSERT_TRUE(scale.grad().defined()) << "checkpoint=" << checkpoint;
    grads.push_back(scale.grad());
  }
  EXPECT_TRUE(torch::equal(grads[0], grads[1]));
}

// Records the storage of the tensor flowing through it, to observe what the
// autograd graph keeps alive after the forward.
class Probe : public LayerImpl {
 public:
  Probe() : LayerImpl("Probe") {}
  Activations Forward(const Activations& in, const MicroBatch&) override {
    storage = in[0].storage().getWeakStorageImpl();
    return in;
  }
  c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
};

TEST(RecomputeTest, GraphKeepsOnlyTheRangeInputs) {
  torch::manual_seed(7);
  auto probe = std::make_shared<Probe>();
  std::vector<Layer> layers = {MakeModuleLayer(torch::nn::Linear(8, 8)), probe,
                               MakeModuleLayer(torch::nn::Linear(8, 8))};
  torch::Tensor x = torch::randn({4, 8}).requires_grad_(true);

  Activations plain = RunLayers(layers, {x}, {});
  EXPECT_FALSE(probe->storage.expired()) << "the second Linear saves its input";
  plain[0].sum().backward();

  Activations ckpt = RunLayersWithRecompute(layers, {x}, {});
  EXPECT_TRUE(probe->storage.expired()) << "a checkpointed range saved an intermediate";
  ckpt[0].sum().backward();
}

TEST(RecomputeTest, InputGradientsOnlyLeaveParameterGradientsAlone) {
  torch::manual_seed(8);
  std::vector<Layer> layers = MakeMlpStack(2, 8, 16, 0.0);
  torch::Tensor x = torch::randn({4, 8}).requires_grad_(true);
  std::vector<torch::Tensor> input_grads;
  for (bool checkpoint : {false, true}) {
    Activations out =
        checkpoint ? RunLayersWithRecompute(layers, {x}, {}) : RunLayers(layers, {x}, {});
    input_grads.push_back(torch::autograd::grad({out[0].sum()}, {x})[0]);
  }
  EXPECT_TRUE(torch::equal(input_grads[0], input_grads[1]));
  for (const torch::Tensor& p : ParametersOf(layers)) EXPECT_FALSE(p.grad().defined());
}

// Zero-bubble's split backward (pipeline/autograd/split_backward.h) through a
// checkpointed range: the input pass recomputes the range, the weight pass
// reuses that recompute; the gradients are those of one full backward.
TEST(RecomputeTest, SplitBackwardRecomputesOnce) {
  for (bool input_needs_grad : {true, false}) {
    torch::manual_seed(9);
    auto forwards = std::make_shared<int>(0);
    std::vector<Layer> layers = MakeMlpStack(2, 8, 16, 0.0);
    layers.insert(layers.begin() + 1,
                  MakeFunctionLayer("Count", [forwards](const torch::Tensor& t) {
                    ++*forwards;
                    return t;
                  }));
    torch::Tensor x0 = torch::randn({4, 8});
    torch::Tensor g = torch::randn({4, 8});
    torch::Tensor x = x0.clone().requires_grad_(input_needs_grad);
    torch::autograd::backward(RunLayers(layers, {x}, {}), {g});
    std::vector<torch::Tensor> want;
    for (torch::Tensor& p : ParametersOf(layers)) {
      want.push_back(p.grad().clone());
      p.mutable_grad().reset();
    }
    torch::Tensor want_x = input_needs_grad ? x.grad().clone() : torch::Tensor();

    *forwards = 0;
    torch::Tensor x2 = x0.clone().requires_grad_(input_needs_grad);
    Activations out = RunLayersWithRecompute(layers, {x2}, {});
    std::vector<torch::Tensor> inputs;
    if (input_needs_grad) inputs.push_back(x2);
    BackwardInputResult split = BackwardInput(out, {g}, inputs);
    out.clear();
    for (const torch::Tensor& p : ParametersOf(layers)) EXPECT_FALSE(p.grad().defined());
    if (input_needs_grad) {
      EXPECT_TRUE(torch::allclose(split.input_grads[0], want_x, 1e-6, 1e-7));
    }
    split.weight.Run();
    EXPECT_EQ(*forwards, 2) << "forward + one recompute (input grad: " << input_needs_grad << ")";
    std::vector<torch::Tensor> params = ParametersOf(layers);
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(params[i].grad().defined()) << i;
      EXPECT_TRUE(torch::allclose(params[i].grad(), want[i], 1e-6, 1e-7)) << "parameter " << i;
    }
  }
}

TEST(RecomputeTest, RangeThatReturnsItsInputUnchanged) {
  std::vector<Layer> layers = {
      MakeFunctionLayer("Identity", [](const torch::Tensor& t) { return t; })};
  torch::Tensor x = torch::randn({3}).requires_grad_(true);
  Activations out = RunLayersWithRecompute(layers, {x}, {});
  (out[0] * torch::tensor({1.0f, 2.0f, 3.0f})).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::tensor({1.0f, 2.0f, 3.0f})));
}

TEST(RecomputeTest, UnregisteredTensorThatRequiresGradFailsLoudly) {
  torch::Tensor hidden_weight = torch::ones({4}).requires_grad_(true);
  std::vector<Layer> layers = {
      MakeModuleLayer(torch::nn::Linear(4, 4)),
      MakeFunctionLayer("ScaleByCapturedWeight",
                        [hidden_weight](const torch::Tensor& t) { return t * hidden_weight; })};
  Activations out = RunLayersWithRecompute(layers, {torch::randn({2, 4})}, {});
  try {
    out[0].sum().backward();
    FAIL() << "expected the lost gradient to be reported";
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ScaleByCapturedWeight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("would be lost"), std::string::npos) << msg;
  }
}

TEST(RecomputeTest, DoubleBackwardThroughARange) {
  torch::manual_seed(12);
  std::vector<Layer> layers = {MakeModuleLayer(torch::nn::Linear(4, 4)),
                               MakeFunctionLayer("Tanh", torch::tanh)};
  torch::Tensor x = torch::randn({3, 4}).requires_grad_(true);
  std::vector<torch::Tensor> second;
  for (bool checkpoint : {false, true}) {
    for (torch::Tensor& p : ParametersOf(layers)) p.mutable_grad() = torch::Tensor();
    Activations out =
        checkpoint ? RunLayersWithRecompute(layers, {x}, {}) : RunLayers(layers, {x}, {});
    torch::Tensor gx = torch::autograd::grad({out[0].pow(2).sum()}, {x}, {}, /*retain_graph=*/true,
                                             /*create_graph=*/true)[0];
    torch::Tensor weight_grad_of_penalty =
        torch::autograd::grad({gx.pow(2).sum()}, {ParametersOf(layers)[0]})[0];
    second.push_back(weight_grad_of_penalty);
  }
  EXPECT_TRUE(torch::allclose(second[0], second[1], 1e-6, 1e-6));
}

TEST(RecomputeTest, WithoutGradModeItIsPlainRunLayers) {
  torch::manual_seed(9);
  std::vector<Layer> layers = MakeMlpStack(2, 8, 16, 0.0);
  torch::Tensor x = torch::randn({4, 8});
  torch::NoGradGuard no_grad;
  Activations out = RunLayersWithRecompute(layers, {x}, {});
  EXPECT_FALSE(out[0].requires_grad());
  EXPECT_TRUE(torch::equal(out[0], RunLayers(layers, {x}, {})[0]));
}

TEST(RecomputeTest, SnapshotRestoresTheCpuStream) {
  torch::manual_seed(10);
  RngSnapshot snapshot = RngSnapshot::Capture();
  torch::Tensor first = torch::rand({5});
  snapshot.Restore();
  EXPECT_TRUE(torch::equal(first, torch::rand({5})));
}

// The devices a snapshot covers: always the CPU; an accelerator only where
// this process has it (a CUDA device asked for in a run without CUDA is left
// out, not an error).
TEST(RecomputeTest, SnapshotCoversTheCpuAndPresentAccelerators) {
  const c10::Device cpu(c10::DeviceType::CPU);
  const c10::Device cuda0(c10::DeviceType::CUDA, 0);
  EXPECT_EQ(RngSnapshot::Capture().devices(), std::vector<c10::Device>({cpu}));
  const std::vector<c10::Device> expected = VisibleCudaDevices() > 0
                                                ? std::vector<c10::Device>{cpu, cuda0}
                                                : std::vector<c10::Device>{cpu};
  EXPECT_EQ(RngSnapshot::Capture({cpu, cuda0, c10::Device(c10::DeviceType::CUDA)}).devices(),
            expected);
}

TEST(RecomputeTest, AcceleratorDevicesOfSkipsCpuAndUndefined) {
  EXPECT_TRUE(AcceleratorDevicesOf({torch::ones({1}), torch::Tensor()}).empty());
  const auto meta = torch::empty({2}, torch::TensorOptions().device(torch::kMeta));
  EXPECT_EQ(AcceleratorDevicesOf({torch::ones({1}), meta, meta}),
            std::vector<c10::Device>({c10::Device(c10::DeviceType::Meta)}));
}

// Dropout on each device: a checkpointed range reproduces the forward's masks
// (drawn from that device's generator) bitwise, and leaves the device's random
// stream where a plain run leaves it.
class RecomputeDeviceTest : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(RecomputeDeviceTest, DropoutMasksAreReproducedOnTheDevice) {
  absl::StatusOr<c10::Device> device = TestDevice(GetParam());
  if (!device.ok()) GTEST_SKIP() << device.status().message();
  torch::manual_seed(21);
  std::vector<Layer> layers = MakeMlpStack(3, 16, 64, /*dropout=*/0.2);
  for (const Layer& layer : layers) {
    layer->to(*device);
    layer->train();
  }
  const torch::Tensor x = torch::randn({32, 16}).to(*device).requires_grad_(true);
  auto run = [&](bool checkpoint) {
    for (torch::Tensor& p : ParametersOf(layers)) p.mutable_grad() = torch::Tensor();
    x.mutable_grad() = torch::Tensor();
    torch::manual_seed(kSeed);  // every device's default generator
    Activations out =
        checkpoint ? RunLayersWithRecompute(layers, {x}, {}) : RunLayers(layers, {x}, {});
    const torch::Tensor weights =
        torch::linspace(-1.0, 2.0, out[0].numel()).reshape(out[0].sizes()).to(*device);
    (out[0] * weights).sum().backward();
    std::vector<torch::Tensor> got = {out[0].cpu(), x.grad().cpu()};
    for (const torch::Tensor& p : ParametersOf(layers)) got.push_back(p.grad().cpu());
    got.push_back(torch::rand({8}, torch::TensorOptions().device(*device)).cpu());
    return got;
  };
  const std::vector<torch::Tensor> plain = run(false);
  const std::vector<torch::Tensor> ckpt = run(true);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain[i], ckpt[i])) << "tensor " << i << " on " << device->str();
  }
  // The masks matter: without dropout the gradients differ.
  for (const Layer& layer : layers) layer->eval();
  EXPECT_FALSE(torch::equal(plain[2], run(false)[2]));
}

INSTANTIATE_TEST_SUITE_P(Devices, RecomputeDeviceTest,
                         ::testing::Values(DeviceKind::kCpu, DeviceKind::kCuda),
                         [](const auto& info) { return DeviceKindName(info.param); });

// Ranks run as threads share the default generator: a recompute's generator
// restore in one thread must never land inside another thread's seeded layer
// build (it once did, and data-parallel replicas started from different
// weights). One thread builds seeded layers while another keeps capturing and
// restoring; every build must equal the reference.
TEST(RecomputeTest, GeneratorRestoreNeverLandsInsideASeededBuild) {
  const LayerFactory factory = [](const LayerContext&) {
    return std::make_shared<MlpBlock>(32, 64, 0.0);
  };
  const torch::Tensor reference =
      BuildSeeded(MakeLayerContext({}, 0, 77), factory)->parameters()[0].clone();
  torch::manual_seed(5);
  const RngSnapshot elsewhere = RngSnapshot::Capture();
  std::atomic<bool> done{false};
  std::thread restorer([&] {
    while (!done.load()) {
      RngSnapshot outer = RngSnapshot::Capture();
      elsewhere.Restore();
      outer.Restore();
    }
  });
  int mismatches = 0;
  for (int i = 0; i < 300; ++i) {
    if (!torch::equal(BuildSeeded(MakeLayerContext({}, 0, 77), factory)->parameters()[0],
                      reference))
      ++mismatches;
  }
  done.store(true);
  restorer.join();
  EXPECT_EQ(mismatches, 0) << "of 300 seeded builds";
}

}  // namespace
}  // namespace pp
