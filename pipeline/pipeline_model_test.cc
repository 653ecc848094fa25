#include "pipeline/pipeline_model.h"

#include <map>
#include <set>

#include "gtest/gtest.h"

namespace pp {
namespace {

constexpr int64_t kVocab = 11;
constexpr int64_t kDim = 8;

// A residual MLP block with nested submodules, so parameter names have depth
// ("layers.3.fc1.weight").
class Block : public LayerImpl {
 public:
  Block() : LayerImpl("Block") {
    fc1_ = register_module("fc1", torch::nn::Linear(kDim, 2 * kDim));
    fc2_ = register_module("fc2", torch::nn::Linear(2 * kDim, kDim));
  }
  Activations Forward(const Activations& in, const MicroBatch&) override {
    return {in[0] + fc2_(torch::gelu(fc1_(in[0])))};
  }

 private:
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

Layer MakeEmbedding(const LayerContext&) {
  return MakeModuleLayer(torch::nn::Embedding(kVocab, kDim));
}

// A small GPT-like list: tied embedding, blocks, a parameter-free layer, a
// norm, and the LM head through the embedding table.
std::vector<LayerSpec> TinyGpt(int num_blocks) {
  std::vector<LayerSpec> specs = {TiedLayerSpec("embed", MakeEmbedding)};
  for (int i = 0; i < num_blocks; ++i)
    specs.push_back(
        LayerSpec("Block", [](const LayerContext&) { return std::make_shared<Block>(); }));
  specs.push_back(LayerSpec("Gelu", [](const LayerContext&) {
    return MakeFunctionLayer("Gelu", [](const torch::Tensor& x) { return torch::gelu(x); });
  }));
  specs.push_back(LayerSpec("LayerNorm", [](const LayerContext&) {
    return MakeModuleLayer(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
  }));
  specs.push_back(
      TiedLayerSpec("embed", MakeEmbedding, TiedProjection("weight")).WithName("LmHead"));
  return specs;
}

std::vector<std::unique_ptr<PipelineModel>> BuildAllStages(const std::vector<LayerSpec>& specs,
                                                           PipelineModelOptions options) {
  std::vector<std::unique_ptr<PipelineModel>> stages;
  for (int64_t s = 0; s < options.num_stages; ++s) {
    absl::StatusOr<std::unique_ptr<PipelineModel>> model = PipelineModel::Create(specs, options, s);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return {};
    stages.push_back(*std::move(model));
  }
  return stages;
}

torch::Tensor Tokens() { return torch::arange(12, torch::kLong).remainder(kVocab).reshape({3, 4}); }
torch::Tensor LossWeights() {
  torch::manual_seed(99);
  return torch::randn({3, 4, kVocab});
}

// Runs the virtual stages one after another the way the runtime does: each
// stage's input is the previous output, detached, as a fresh leaf; backward
// runs stage by stage with the received gradient.
torch::Tensor ComposeStages(const std::vector<std::unique_ptr<PipelineModel>>& stages,
                            const torch::Tensor& tokens, const torch::Tensor& loss_weights) {
  const int64_t p = stages.size();
  const int64_t v = stages[0]->num_chunks();
  MicroBatch batch;
  std::vector<Activations> inputs, outputs;
  Activations x = {tokens};
  for (int64_t part = 0; part < p * v; ++part) {
    inputs.push_back(x);
    outputs.push_back(stages[part % p]->chunk(part / p)->Forward(x, batch));
    x = {outputs.back()[0].detach().requires_grad_(true)};
  }
  torch::Tensor logits = outputs.back()[0];
  torch::Tensor grad = loss_weights.clone();
  for (int64_t part = p * v - 1; part >= 0; --part) {
    outputs[part][0].backward(grad);
    if (part > 0) grad = inputs[part][0].grad();
  }
  return logits.detach();
}

// Global name -> gradient, tied gradients summed over the stages that hold a
// copy (what the runtime's tied all-reduce produces).
std::map<std::string, torch::Tensor> StageGradients(
    const std::vector<std::unique_ptr<PipelineModel>>& stages) {
  std::map<std::string, torch::Tensor> grads;
  for (const auto& stage : stages) {
    for (const auto& item : stage->named_parameters()) {
      torch::Tensor g = item.value().grad();
      if (!g.defined()) g = torch::zeros_like(item.value());
      auto it = grads.find(item.key());
      if (it == grads.end()) {
        grads.emplace(item.key(), g.clone());
      } else {
        it->second = it->second + g;
      }
    }
  }
  return grads;
}

TEST(PipelineModelTest, WeightsDoNotDependOnThePartition) {
  const std::vector<LayerSpec> specs = TinyGpt(4);
  std::map<std::string, torch::Tensor> reference;
  for (int64_t p = 1; p <= 4; ++p) {
    PipelineModelOptions options;
    options.num_stages = p;
    options.partition_method = "uniform";
    std::map<std::string, torch::Tensor> weights;
    for (const auto& stage : BuildAllStages(specs, options)) {
      for (const auto& item : stage->named_parameters()) {
        auto [it, inserted] = weights.emplace(item.key(), item.value());
        // A tied copy on a second stage starts identical to the first.
        if (!inserted) {
          EXPECT_TRUE(torch::equal(it->second, item.value())) << item.key();
        }
      }
    }
    if (p == 1) {
      reference = weights;
      EXPECT_TRUE(reference.count("layers.3.fc1.weight")) << "global names";
      EXPECT_TRUE(reference.count("tied.embed.weight"));
      EXPECT_TRUE(reference.count("layers.6.weight")) << "LayerNorm at index 6";
      continue;
    }
    ASSERT_EQ(weights.size(), reference.size()) << p << " stages";
    for (const auto& [name, w] : reference) {
      ASSERT_TRUE(weights.count(name)) << name;
      EXPECT_TRUE(torch::equal(weights[name], w)) << name << " differs with " << p << " stages";
    }
  }
}

TEST(PipelineModelTest, BuildingLeavesTheCallersRngAlone) {
  torch::manual_seed(7);
  const torch::Tensor expected = torch::rand({4});
  torch::manual_seed(7);
  PipelineModelOptions options;
  options.num_stages = 2;
  ASSERT_TRUE(PipelineModel::Create(TinyGpt(2), options, 1).ok());
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

TEST(PipelineModelTest, ToSequentialMatchesStageCompositionBitwise) {
  at::set_num_threads(1);
  const std::vector<LayerSpec> specs = TinyGpt(5);
  struct Config {
    int64_t stages, chunks;
    std::string method;
  };
  for (const Config& config : std::vector<Config>{{1, 1, "uniform"},
                                                  {2, 1, "parameters"},
                                                  {3, 1, "type:Block"},
                                                  {2, 2, "uniform"},
                                                  {1, 3, "uniform"}}) {
    SCOPED_TRACE(config.method + " stages=" + std::to_string(config.stages) +
                 " chunks=" + std::to_string(config.chunks));
    PipelineModelOptions options;
    options.num_stages = config.stages;
    options.chunks = config.chunks;
    options.partition_method = config.method;
    auto stages = BuildAllStages(specs, options);
    ASSERT_EQ(stages.size(), config.stages);
    const torch::Tensor tokens = Tokens();
    const torch::Tensor loss_weights = LossWeights();
    const torch::Tensor staged_logits = ComposeStages(stages, tokens, loss_weights);
    const auto staged_grads = StageGradients(stages);

    StageModule sequential = stages[0]->ToSequential();
    const torch::Tensor logits = sequential->Forward({tokens}, MicroBatch{})[0];
    logits.backward(loss_weights);
    EXPECT_TRUE(torch::equal(logits.detach(), staged_logits));
    const auto seq_params = sequential->named_parameters();
    EXPECT_EQ(seq_params.size(), staged_grads.size());
    for (const auto& item : seq_params) {
      ASSERT_TRUE(staged_grads.count(item.key())) << item.key();
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      EXPECT_TRUE(torch::equal(item.value().grad(), staged_grads.at(item.key()))) << item.key();
    }
  }
}

TEST(PipelineModelTest, LayerRunnerHookIsUsedByStagesAndSequential) {
  int calls = 0;
  LayerRunner counting = [&calls](const std::vector<Layer>& layers, Activations in,
                                  const MicroBatch& mb) {
    ++calls;
    return RunLayers(layers, std::move(in), mb);
  };
  PipelineModelOptions options;
  options.partition_method = "uniform";
  auto model = *PipelineModel::Create(TinyGpt(1), options, 0);
  model->set_layer_runner(counting);
  model->chunk(0)->Forward({Tokens()}, MicroBatch{});
  EXPECT_EQ(calls, 1);
  StageModule sequential = model->ToSequential(counting);
  sequential->Forward({Tokens()}, MicroBatch{});
  EXPECT_EQ(calls, 2);
  model->set_layer_runner(nullptr);  // Back to RunLayers.
  model->chunk(0)->Forward({Tokens()}, MicroBatch{});
  EXPECT_EQ(calls, 2);
}

TEST(PipelineModelTest, InterleavedChunksOwnEveryPthPart) {
  const std::vector<LayerSpec> specs = TinyGpt(5);  // 9 layers.
  PipelineModelOptions options;
  options.num_stages = 2;
  options.chunks = 2;
  options.partition_method = "uniform";  // [0,3,5,7,9]
  auto stages = BuildAllStages(specs, options);
  ASSERT_EQ(stages[0]->bounds(), (Bounds{0, 3, 5, 7, 9}));
  EXPECT_EQ(stages[0]->chunk(0)->virtual_stage(), 0);
  EXPECT_EQ(stages[0]->chunk(0)->first_layer(), 0);
  EXPECT_EQ(stages[0]->chunk(1)->virtual_stage(), 2);
  EXPECT_EQ(stages[0]->chunk(1)->first_layer(), 5);
  EXPECT_EQ(stages[1]->chunk(0)->virtual_stage(), 1);
  EXPECT_EQ(stages[1]->chunk(0)->first_layer(), 3);
  EXPECT_EQ(stages[1]->chunk(1)->virtual_stage(), 3);
  EXPECT_EQ(stages[1]->chunk(1)->end_layer(), 9);
  EXPECT_EQ(stages[1]->StageOfLayer(6), 0);
  EXPECT_EQ(stages[1]->ChunkOfLayer(6), 1);
  // Each chunk only names its own layers.
  for (const auto& item : stages[0]->chunk_named_parameters(1)) {
    EXPECT_EQ(item.key().rfind("layers.5.", 0) == 0 || item.key().rfind("layers.6.", 0) == 0, true)
        << item.key();
  }
}

// V placement (zbv): stage r holds virtual stages r and 2p - 1 - r, so with
// p = 2 the tied embedding (part 0) and LM head (part 3) are both on stage 0:
// one tied module, no tie communication.
TEST(PipelineModelTest, VPlacementChunksAndTies) {
  const std::vector<LayerSpec> specs = TinyGpt(5);  // 9 layers.
  PipelineModelOptions options;
  options.num_stages = 2;
  options.chunks = 2;
  options.partition_method = "uniform";  // [0,3,5,7,9]
  options.stage_to_rank = {0, 1, 1, 0};
  auto stages = BuildAllStages(specs, options);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0]->chunk(0)->virtual_stage(), 0);
  EXPECT_EQ(stages[0]->chunk(1)->virtual_stage(), 3);
  EXPECT_EQ(stages[0]->chunk(1)->first_layer(), 7);
  EXPECT_EQ(stages[1]->chunk(0)->virtual_stage(), 1);
  EXPECT_EQ(stages[1]->chunk(1)->virtual_stage(), 2);
  EXPECT_EQ(stages[1]->chunk(1)->first_layer(), 5);
  EXPECT_EQ(stages[0]->StageOfLayer(8), 0);
  EXPECT_EQ(stages[0]->ChunkOfLayer(8), 1);
  EXPECT_EQ(stages[0]->StageOfLayer(5), 1);
  EXPECT_EQ(stages[0]->ChunkOfLayer(5), 1);
  EXPECT_EQ(stages[0]->placement(), (std::vector<int>{0, 1, 1, 0}));
  ASSERT_EQ(stages[0]->tie_groups().size(), 1u);
  EXPECT_EQ(stages[0]->tie_groups()[0].stages, (std::vector<int64_t>{0}));
  EXPECT_NE(stages[0]->PartitionReport().find("stage=0 chunk=1 (part 3)"), std::string::npos)
      << stages[0]->PartitionReport();
  // Same weights as the looped partition: they depend on the layer index only.
  PipelineModelOptions looped = options;
  looped.stage_to_rank.clear();
  auto looped_stages = BuildAllStages(specs, looped);
  auto v = stages[1]->named_parameters();
  auto l = looped_stages[0]->named_parameters();  // looped: part 2 is on stage 0
  ASSERT_TRUE(v.contains("layers.5.fc1.weight"));
  EXPECT_TRUE(torch::equal(v["layers.5.fc1.weight"], l["layers.5.fc1.weight"]));
}

TEST(PipelineModelTest, RejectsBadPlacement) {
  const std::vector<LayerSpec> specs = TinyGpt(5);
  PipelineModelOptions options;
  options.num_stages = 2;
  options.chunks = 2;
  for (const auto& [placement, message] : std::vector<std::pair<std::vector<int>, std::string>>{
           {{0, 1, 1}, "stage_to_rank has 3 entries"},
           {{0, 1, 2, 0}, "stage_to_rank[2] = 2 is outside [0, 2)"},
           {{0, 0, 0, 1}, "places 3 virtual stages on stage 0"}}) {
    options.stage_to_rank = placement;
    auto model = PipelineModel::Create(specs, options, 0);
    ASSERT_FALSE(model.ok()) << message;
    EXPECT_NE(std::string(model.status().message()).find(message), std::string::npos)
        << model.status();
  }
}

TEST(PipelineModelTest, TieGroupsAreTheSameOnTheStagesThatHoldThem) {
  const std::vector<LayerSpec> specs = TinyGpt(4);  // 8 layers; embed at 0 and 7.
  PipelineModelOptions options;
  options.num_stages = 3;
  options.partition_method = "uniform";
  auto stages = BuildAllStages(specs, options);
  for (const auto& stage : stages) {
    ASSERT_EQ(stage->tie_groups().size(), 1u);
    const TieGroup& group = stage->tie_groups()[0];
    EXPECT_EQ(group.key, "embed");
    EXPECT_EQ(group.stages, (std::vector<int64_t>{0, 2}));
    EXPECT_EQ(group.layer_indices, (std::vector<int64_t>{0, 7}));
    EXPECT_EQ(group.param_names, (std::vector<std::string>{"tied.embed.weight"}));
  }
  EXPECT_EQ(stages[0]->LocalTieGroups().size(), 1u);
  EXPECT_TRUE(stages[1]->LocalTieGroups().empty());
  EXPECT_EQ(stages[1]->TiedParameters("embed").status().code(), absl::StatusCode::kNotFound);
  auto first = *stages[0]->TiedParameters("embed");
  auto last = *stages[2]->TiedParameters("embed");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_TRUE(torch::equal(first["tied.embed.weight"], last["tied.embed.weight"]));
  // Distinct copies: the runtime broadcasts and all-reduces between them.
  EXPECT_FALSE(first["tied.embed.weight"].is_same(last["tied.embed.weight"]));
  EXPECT_TRUE(
      first["tied.embed.weight"].is_same(stages[0]->named_parameters()["tied.embed.weight"]));
}

TEST(PipelineModelTest, TiedModuleUsedByTwoChunksOfOneStageIsOneParameter) {
  PipelineModelOptions options;
  options.chunks = 2;
  options.partition_method = "uniform";
  auto model = *PipelineModel::Create(TinyGpt(2), options, 0);
  EXPECT_TRUE(model->chunk_named_parameters(0).contains("tied.embed.weight"));
  EXPECT_TRUE(model->chunk_named_parameters(1).contains("tied.embed.weight"));
  int count = 0;
  for (const auto& item : model->named_parameters()) count += item.key() == "tied.embed.weight";
  EXPECT_EQ(count, 1);
  EXPECT_EQ(model->tie_groups()[0].stages, (std::vector<int64_t>{0}));
}

TEST(PipelineModelTest, DeclaredTiedParameterNamesAreChecked) {
  std::vector<LayerSpec> specs = {
      TiedLayerSpec("embed", MakeEmbedding, nullptr, {"bias"}),
      TiedLayerSpec("embed", MakeEmbedding, TiedProjection(), {"bias"})};
  absl::StatusOr<std::unique_ptr<PipelineModel>> model = PipelineModel::Create(specs, {}, 0);
  ASSERT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("'bias'"), std::string::npos) << model.status();
  EXPECT_NE(model.status().message().find("weight"), std::string::npos) << model.status();
}

TEST(PipelineModelTest, RejectsBadInput) {
  PipelineModelOptions options;
  auto status_of = [](std::vector<LayerSpec> specs, PipelineModelOptions o, int64_t stage) {
    return PipelineModel::Create(std::move(specs), o, stage).status();
  };
  EXPECT_NE(status_of({}, options, 0).message().find("empty"), std::string::npos);

  options.partition_method = "fastest";
  absl::Status unknown = status_of(TinyGpt(1), options, 0);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("uniform"), std::string::npos) << unknown;

  options.partition_method = "uniform";
  options.chunks = 0;
  EXPECT_NE(status_of(TinyGpt(1), options, 0).message().find("chunks must be >= 1, got 0"),
            std::string::npos);
  options.chunks = 1;
  options.num_stages = 2;
  EXPECT_NE(status_of(TinyGpt(1), options, 2).message().find("stage 2 is outside [0, 2)"),
            std::string::npos);
  options.num_stages = 3;
  options.chunks = 2;
  absl::Status few = status_of(TinyGpt(1), options, 0);  // 5 layers into 6 parts.
  EXPECT_NE(few.message().find("5 layers into 6 parts"), std::string::npos) << few;
  options.num_stages = int64_t{1} << 62;
  options.chunks = 4;
  absl::Status overflow = status_of(TinyGpt(1), options, 0);
  EXPECT_EQ(overflow.code(), absl::StatusCode::kInvalidArgument) << overflow;
  EXPECT_NE(overflow.message().find("chunks (4) overflows int64"), std::string::npos) << overflow;
  options.num_stages = 2;
  options.chunks = 1;
  options.bounds = {0, 5, 4};
  EXPECT_EQ(status_of(TinyGpt(1), options, 0).code(), absl::StatusCode::kInvalidArgument);
  options.bounds = {0, 2, 5};
  EXPECT_EQ((*PipelineModel::Create(TinyGpt(1), options, 1))->chunk(0)->first_layer(), 2);
}

TEST(PipelineModelTest, PartitionReportNamesStagesLayersAndCounts) {
  PipelineModelOptions options;
  options.num_stages = 2;
  options.partition_method = "uniform";
  auto model = *PipelineModel::Create(TinyGpt(2), options, 0);
  const std::string report = model->PartitionReport();
  // Embedding 11*8 = 88; Block 8*16+16 + 16*8+8 = 280.
  EXPECT_NE(report.find("stage=0 chunk=0 (part 0) layers=[0, 3) params=648\n"), std::string::npos)
      << report;
  EXPECT_NE(report.find("     5: LmHead [tied embed]"), std::string::npos) << report;
}

}  // namespace
}  // namespace pp
