#include "pipeline/autograd/activation_checkpointing.h"

#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pipeline/testing/mlp_block.h"

namespace pp {
namespace {

std::vector<LayerTraits> Traits(const std::vector<Layer>& layers) {
  std::vector<LayerTraits> traits;
  for (const Layer& layer : layers) traits.push_back(TraitsOf(*layer));
  return traits;
}

// DeepSpeed's tests/unit/runtime/pipe/test_pipe_module.py case.
std::vector<Layer> ReluThenLinear() {
  std::vector<Layer> layers;
  for (int i = 0; i < 4; ++i) layers.push_back(MakeModuleLayer(torch::nn::ReLU()));
  for (int i = 0; i < 4; ++i) layers.push_back(MakeModuleLayer(torch::nn::Linear(4, 4)));
  return layers;
}

std::vector<LayerRun> PlanOrDie(const ActivationCheckpointPolicy& policy,
                                const std::vector<LayerTraits>& traits) {
  absl::StatusOr<std::vector<LayerRun>> runs = PlanLayerRuns(policy, traits);
  EXPECT_TRUE(runs.ok()) << runs.status();
  return runs.ok() ? *runs : std::vector<LayerRun>{};
}

ActivationCheckpointPolicy Policy(int64_t interval, std::string types = "") {
  ActivationCheckpointPolicy policy;
  policy.interval = interval;
  policy.checkpointable_types = std::move(types);
  return policy;
}

TEST(PlanLayerRunsTest, DeepSpeedCaseChecksOnlyTheRunWithParameters) {
  std::vector<LayerTraits> traits = Traits(ReluThenLinear());
  EXPECT_EQ(traits[0].type_name, "ReLU");
  EXPECT_FALSE(traits[0].has_parameters);
  EXPECT_TRUE(traits[4].has_parameters);
  EXPECT_EQ(PlanOrDie(Policy(4), traits), (std::vector<LayerRun>{{0, 4, false}, {4, 8, true}}));
}

TEST(PlanLayerRunsTest, IntervalsThatDoNotDivideTheLayerCount) {
  std::vector<LayerTraits> traits = Traits(ReluThenLinear());
  EXPECT_EQ(PlanOrDie(Policy(3), traits),
            (std::vector<LayerRun>{{0, 3, false}, {3, 6, true}, {6, 8, true}}));
  EXPECT_EQ(PlanOrDie(Policy(100), traits), (std::vector<LayerRun>{{0, 8, true}}));
  EXPECT_EQ(PlanOrDie(Policy(1), traits).size(), 8u);
}

TEST(PlanLayerRunsTest, IntervalZeroIsOff) {
  std::vector<LayerTraits> traits = Traits(ReluThenLinear());
  EXPECT_EQ(PlanOrDie(Policy(0), traits), (std::vector<LayerRun>{{0, 8, false}}));
  EXPECT_TRUE(PlanOrDie(Policy(0), {}).empty());
  EXPECT_TRUE(PlanOrDie(Policy(2), {}).empty());
}

TEST(PlanLayerRunsTest, TypeRegexNeedsEveryLayerOfTheRunToMatch) {
  std::vector<LayerTraits> traits = Traits(ReluThenLinear());
  // ReLU has no parameters but is listed, so its runs are checkpointed.
  EXPECT_EQ(PlanOrDie(Policy(2, "ReLU"), traits),
            (std::vector<LayerRun>{{0, 2, true}, {2, 4, true}, {4, 6, false}, {6, 8, false}}));
  // A run that straddles both types matches only when both are listed.
  EXPECT_EQ(PlanOrDie(Policy(3, "Linear"), traits),
            (std::vector<LayerRun>{{0, 3, false}, {3, 6, false}, {6, 8, true}}));
  EXPECT_EQ(PlanOrDie(Policy(3, TypeNamesRegex({"Linear", "ReLU"})), traits),
            (std::vector<LayerRun>{{0, 3, true}, {3, 6, true}, {6, 8, true}}));
  // Whole-name match: "Lin" is not "Linear".
  EXPECT_EQ(PlanOrDie(Policy(8, "Lin"), traits), (std::vector<LayerRun>{{0, 8, false}}));
}

TEST(PlanLayerRunsTest, TypeNamesRegexEscapesAndMatchesExactly) {
  std::regex re(TypeNamesRegex({"Block(v2)", "a.b"}));
  EXPECT_TRUE(std::regex_match("Block(v2)", re));
  EXPECT_TRUE(std::regex_match("a.b", re));
  EXPECT_FALSE(std::regex_match("axb", re));
  EXPECT_FALSE(std::regex_match("Block", re));
  EXPECT_FALSE(std::regex_match("", std::regex(TypeNamesRegex({}))));
}

TEST(PlanLayerRunsTest, RejectsBadPolicies) {
  absl::StatusOr<std::vector<LayerRun>> negative = PlanLayerRuns(Policy(-2), {});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(negative.status().message().find("(-2)"), std::string::npos) << negative.status();
  absl::StatusOr<LayerRunner> bad_regex = MakeCheckpointingRunner(Policy(1, "Block("));
  EXPECT_EQ(bad_regex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_regex.status().message().find("'Block('"), std::string::npos) << bad_regex.status();
}

// Counts its forward calls: a checkpointed layer runs twice per step (forward
// and recompute), an uncheckpointed one once.
class CountingBlock : public MlpBlock {
 public:
  CountingBlock() : MlpBlock(8, 16, /*dropout=*/0.1) {}
  Activations Forward(const Activations& in, const MicroBatch& batch) override {
    ++calls;
    return MlpBlock::Forward(in, batch);
  }
  int calls = 0;
};

TEST(CheckpointingRunnerTest, AppliesThePlanAndMatchesRunLayersBitwise) {
  torch::manual_seed(1);
  std::vector<std::shared_ptr<CountingBlock>> blocks;
  std::vector<Layer> layers;
  for (int i = 0; i < 5; ++i) {
    blocks.push_back(std::make_shared<CountingBlock>());
    layers.push_back(blocks.back());
    if (i == 1) layers.push_back(MakeFunctionLayer("Tanh", torch::tanh));
  }
  // Layers: Block Block Tanh | Block Block Block; with interval 3 and the type
  // list {MlpBlock} only the second run is checkpointed.
  absl::StatusOr<LayerRunner> runner = MakeCheckpointingRunner(Policy(3, "MlpBlock"));
  ASSERT_TRUE(runner.ok()) << runner.status();
  torch::Tensor x = torch::randn({6, 8}).requires_grad_(true);

  std::vector<std::vector<torch::Tensor>> grads;
  for (bool checkpoint : {false, true}) {
    for (const Layer& layer : layers) layer->zero_grad(/*set_to_none=*/true);
    x.mutable_grad() = torch::Tensor();
    for (auto& block : blocks) block->calls = 0;
    torch::manual_seed(42);
    Activations out = checkpoint ? (*runner)(layers, {x}, {}) : RunLayers(layers, {x}, {});
    out[0].pow(2).sum().backward();
    std::vector<torch::Tensor> step_grads = {x.grad().clone()};
    for (const Layer& layer : layers) {
      for (const torch::Tensor& p : layer->parameters()) step_grads.push_back(p.grad().clone());
    }
    grads.push_back(step_grads);
    std::vector<int> calls;
    for (auto& block : blocks) calls.push_back(block->calls);
    EXPECT_EQ(calls, checkpoint ? std::vector<int>({1, 1, 2, 2, 2}) : std::vector<int>(5, 1));
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(grads[0][i], grads[1][i])) << "gradient " << i;
  }
}

TEST(CheckpointingRunnerTest, IntervalZeroRunsEachLayerOnce) {
  torch::manual_seed(2);
  auto block = std::make_shared<CountingBlock>();
  absl::StatusOr<LayerRunner> runner = MakeCheckpointingRunner(Policy(0));
  ASSERT_TRUE(runner.ok());
  Activations out = (*runner)({block}, {torch::randn({2, 8})}, {});
  out[0].sum().backward();
  EXPECT_EQ(block->calls, 1);
}

}  // namespace
}  // namespace pp
