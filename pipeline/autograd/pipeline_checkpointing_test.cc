// Activation checkpointing through the PipelineModel hooks: the same runner on
// every StageModule and on ToSequential() gives the uncheckpointed gradients,
// with a tied embedding (fed integer token ids) and LM head on different stages.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pipeline/autograd/activation_checkpointing.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/testing/mlp_block.h"

namespace pp {
namespace {

constexpr int64_t kVocab = 40;
constexpr int64_t kWidth = 16;

std::vector<LayerSpec> TinyLm(double dropout) {
  auto embedding = [](const LayerContext&) {
    return MakeModuleLayer(torch::nn::Embedding(kVocab, kWidth));
  };
  std::vector<LayerSpec> specs = {TiedLayerSpec("embed", embedding)};
  for (int i = 0; i < 4; ++i) {
    specs.push_back(LayerSpec("MlpBlock", [dropout](const LayerContext&) {
      return std::make_shared<MlpBlock>(kWidth, 2 * kWidth, dropout);
    }));
  }
  specs.push_back(TiedLayerSpec("embed", embedding, TiedProjection("weight")).WithName("LmHead"));
  return specs;
}

torch::Tensor Tokens() { return torch::arange(12, torch::kLong).remainder(kVocab).reshape({3, 4}); }

// Weighs each logit differently so every gradient entry matters.
torch::Tensor Loss(const torch::Tensor& logits) {
  return (logits * torch::linspace(-1.0, 1.0, logits.numel()).reshape(logits.sizes())).sum();
}

LayerRunner Runner(int64_t interval) {
  ActivationCheckpointPolicy policy;
  policy.interval = interval;
  absl::StatusOr<LayerRunner> runner = MakeCheckpointingRunner(policy);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return *runner;
}

using Grads = std::map<std::string, torch::Tensor>;

Grads SequentialGrads(const PipelineModel& model, const LayerRunner& runner) {
  StageModule sequential = model.ToSequential(runner);
  sequential->train();
  torch::manual_seed(7);
  Loss(sequential->Forward({Tokens()}, MicroBatch{})[0]).backward();
  Grads grads;
  for (const auto& item : sequential->named_parameters()) {
    EXPECT_TRUE(item.value().grad().defined()) << item.key();
    grads[item.key()] = item.value().grad();
  }
  return grads;
}

TEST(PipelineCheckpointingTest, ToSequentialWithTheRunnerMatchesWithoutBitwise) {
  at::set_num_threads(1);
  PipelineModelOptions options;
  auto model = *PipelineModel::Create(TinyLm(/*dropout=*/0.1), options, 0);
  Grads plain = SequentialGrads(*model, nullptr);
  for (int64_t interval : {1, 2, 6, 100}) {
    SCOPED_TRACE("interval " + std::to_string(interval));
    Grads ckpt = SequentialGrads(*model, Runner(interval));
    ASSERT_EQ(ckpt.size(), plain.size());
    for (const auto& [name, grad] : plain) {
      ASSERT_TRUE(ckpt.at(name).defined()) << name;
      EXPECT_TRUE(torch::equal(grad, ckpt.at(name))) << name;
    }
  }
}

TEST(PipelineCheckpointingTest, CheckpointedStagesMatchTheSequentialModelBitwise) {
  at::set_num_threads(1);
  PipelineModelOptions options;
  options.num_stages = 2;
  options.bounds = {0, 2, 6};  // Stage 0: embedding + block; stage 1: 3 blocks + LM head.
  auto stage0 = *PipelineModel::Create(TinyLm(0.0), options, 0);
  auto stage1 = *PipelineModel::Create(TinyLm(0.0), options, 1);
  Grads reference = SequentialGrads(*stage0, nullptr);

  const LayerRunner runner = Runner(2);
  stage0->set_layer_runner(runner);
  stage1->set_layer_runner(runner);
  // Stage 0's first run is [embedding, block] fed integer ids: DeepSpeed's
  // "does not require grad" case (#4274, #4479).
  torch::Tensor sent = stage0->chunk(0)->Forward({Tokens()}, MicroBatch{})[0];
  torch::Tensor received = sent.detach().requires_grad_(true);
  Loss(stage1->chunk(0)->Forward({received}, MicroBatch{})[0]).backward();
  sent.backward(received.grad());

  Grads staged;
  for (auto* stage : {stage0.get(), stage1.get()}) {
    for (const auto& item : stage->named_parameters()) {
      ASSERT_TRUE(item.value().grad().defined()) << item.key() << " got no gradient";
      // A tied key's copies each hold part of the gradient; the tie group's
      // all-reduce sums them.
      auto it = staged.find(item.key());
      staged[item.key()] =
          it == staged.end() ? item.value().grad() : it->second + item.value().grad();
    }
  }
  ASSERT_EQ(staged.size(), reference.size());
  for (const auto& [name, grad] : reference) {
    EXPECT_TRUE(torch::equal(grad, staged.at(name))) << name;
  }
}

}  // namespace
}  // namespace pp
