#include "models/bert/bert.h"

#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "models/config_testing.h"
#include "models/data/mlm_data.h"
#include "models/data/tokenizer.h"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace {

// The whole model in one process (ToSequential's builder), from the first layer.
Activations RunModel(StageModule& model, const MicroBatch& batch) {
  return model->Forward({}, batch);
}

BertModelConfig Tiny() {
  return ParseModelConfig<BertModelConfig>(
      "vocab_size: 260 context_length: 32 width: 32 num_heads: 4 num_layers: 2");
}

std::string Text() {
  std::string text;
  for (int i = 0; i < 100; ++i)
    text += "Pipelines split models. Stages pass activations. Bubbles cost time. ";
  return text;
}

TEST(BertSpecsTest, LayoutTiesAndDeclaredCounts) {
  absl::StatusOr<std::vector<LayerSpec>> specs = MakeBertSpecs(Tiny());
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 2u + 4u);
  const std::vector<std::string> names = {"BertEmbedding", "EncoderBlock", "EncoderBlock",
                                          "MlmTransform",  "MlmDecoder",   "MlmBias"};
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ((*specs)[i].name(), names[i]);
  EXPECT_EQ((*specs)[0].tie_key(), "embed");
  EXPECT_EQ((*specs)[4].tie_key(), "embed");
  for (size_t i : {0, 1, 3, 5}) {
    Layer layer = BuildSpecLayer((*specs)[i], i, /*base_seed=*/0);
    EXPECT_EQ(*(*specs)[i].declared_parameter_count(), CountTrainableParameters(*layer))
        << names[i];
    EXPECT_EQ(layer->TypeName(), names[i]);
  }
}

TEST(BertTest, ShapesAndLossOverMaskedPositionsOnly) {
  absl::StatusOr<MlmBatchSource> data =
      MlmBatchSource::Create(Text(), {.seq_len = 32, .micro_batch_size = 4, .num_microbatches = 1});
  ASSERT_TRUE(data.ok()) << data.status();
  StageModule model = *BuildSequential(*MakeBertSpecs(Tiny()), 1234);
  MicroBatch batch = data->Batch(0, 0);
  Activations out = RunModel(model, batch);
  ASSERT_EQ(out[0].sizes(), (std::vector<int64_t>{4, 32, 260}));
  const torch::Tensor loss = BertMlmLoss(out, batch);
  EXPECT_NEAR(loss.item<double>(), std::log(260.0), 0.5);
  // Changing logits at unselected positions leaves the loss as it is.
  const torch::Tensor unselected = (batch.Get("labels") == kIgnoreLabel).unsqueeze(-1);
  torch::Tensor perturbed = out[0] + unselected.to(torch::kFloat) * torch::randn_like(out[0]) * 10;
  EXPECT_TRUE(torch::allclose(BertMlmLoss({perturbed}, batch), loss));
  // ... and at selected ones it changes.
  EXPECT_FALSE(torch::allclose(BertMlmLoss({out[0] + torch::randn_like(out[0])}, batch), loss));
}

TEST(BertTest, PaddingIsInvisibleToRealTokens) {
  StageModule model = *BuildSequential(*MakeBertSpecs(Tiny()), 1234);
  MicroBatch batch;
  torch::Tensor ids = torch::randint(0, 256, {2, 32}, torch::kLong);
  torch::Tensor mask = torch::ones({2, 32}, torch::kBool);
  mask.index_put_({0, torch::indexing::Slice(20)}, false);
  mask.index_put_({1, torch::indexing::Slice(7)}, false);
  batch.tensors["input_ids"] = ids;
  batch.tensors["attention_mask"] = mask;
  torch::Tensor a = RunModel(model, batch)[0];
  // Different tokens behind the padding mask: real positions see no change.
  batch.tensors["input_ids"] = torch::where(mask, ids, torch::full_like(ids, ByteTokenizer::kPad));
  torch::Tensor b = RunModel(model, batch)[0];
  EXPECT_TRUE(torch::allclose(a[0].slice(0, 0, 20), b[0].slice(0, 0, 20), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(a[1].slice(0, 0, 7), b[1].slice(0, 0, 7), 1e-5, 1e-5));
  // Without the mask the change leaks into the real positions.
  batch.tensors.erase("attention_mask");
  torch::Tensor c = RunModel(model, batch)[0];
  EXPECT_FALSE(torch::allclose(a[0].slice(0, 0, 20), c[0].slice(0, 0, 20), 1e-5, 1e-5));
}

TEST(BertTest, AttentionIsBidirectionalAndTokenTypesMatter) {
  StageModule model = *BuildSequential(*MakeBertSpecs(Tiny()), 1234);
  MicroBatch batch;
  torch::Tensor ids = torch::randint(0, 256, {1, 16}, torch::kLong);
  batch.tensors["input_ids"] = ids;
  torch::Tensor a = RunModel(model, batch)[0];
  torch::Tensor changed = ids.clone();
  changed.index_put_({0, 15}, (ids[0][15] + 1) % 256);
  batch.tensors["input_ids"] = changed;
  EXPECT_FALSE(
      torch::allclose(a[0][0], RunModel(model, batch)[0][0][0]));  // position 0 sees position 15
  batch.tensors["input_ids"] = ids;
  batch.tensors["token_type_ids"] = torch::ones({1, 16}, torch::kLong);
  EXPECT_FALSE(torch::allclose(a, RunModel(model, batch)[0]));
}

TEST(BertTest, LearnsMaskedTokens) {
  absl::StatusOr<MlmBatchSource> data = MlmBatchSource::Create(
      Text(), {.seq_len = 32, .micro_batch_size = 8, .num_microbatches = 1, .seed = 5});
  ASSERT_TRUE(data.ok()) << data.status();
  StageModule model = *BuildSequential(*MakeBertSpecs(Tiny()), 1234);
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(3e-3).weight_decay(0.0));
  double first = 0, recent = 0;
  for (int step = 0; step < 80; ++step) {
    MicroBatch batch = data->Batch(step, 0);
    optimizer.zero_grad();
    torch::Tensor loss = BertMlmLoss(RunModel(model, batch), batch);
    loss.backward();
    optimizer.step();
    if (step == 0) first = loss.item<double>();
    if (step >= 70) recent += loss.item<double>() / 10;
  }
  EXPECT_GT(first, 5.0);
  EXPECT_LT(recent, 3.5) << "loss went from " << first << " to " << recent;
}

TEST(BertConfigTest, BadConfigsNameTheField) {
  BertModelConfig c = Tiny();
  c.set_width(30);
  EXPECT_NE(MakeBertSpecs(c).status().message().find(
                "bert.width (30) must be a multiple of bert.num_heads (4)"),
            std::string::npos);
  c = Tiny();
  c.set_vocab_size(0);
  EXPECT_NE(ValidateBertModelConfig(c).message().find("bert.vocab_size (0)"), std::string::npos);
}

}  // namespace
}  // namespace pp
