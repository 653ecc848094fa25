#include "pipeline/layers/layer.h"

#include "gtest/gtest.h"

namespace pp {
namespace {

TEST(LayerTest, ModuleLayerExposesWrappedParametersUnderTheirOwnNames) {
  Layer layer = MakeModuleLayer(torch::nn::Linear(3, 2));
  EXPECT_EQ(layer->TypeName(), "Linear");
  auto params = layer->named_parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_TRUE(params.contains("weight"));
  EXPECT_TRUE(params.contains("bias"));
  Activations out = layer->Forward({torch::ones({4, 3})}, MicroBatch{});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].sizes(), (std::vector<int64_t>{4, 2}));
}

TEST(LayerTest, FunctionLayerSeesTheMicroBatch) {
  Layer mask = MakeFunctionLayer("ApplyMask", [](const Activations& in, const MicroBatch& mb) {
    return Activations{in[0] * mb.Get("mask")};
  });
  MicroBatch mb{7, {{"mask", torch::tensor({1.0f, 0.0f})}}};
  Activations out = mask->Forward({torch::tensor({2.0f, 3.0f})}, mb);
  EXPECT_TRUE(torch::equal(out[0], torch::tensor({2.0f, 0.0f})));
  EXPECT_EQ(mask->TypeName(), "ApplyMask");
  EXPECT_TRUE(mask->parameters().empty());
}

TEST(LayerTest, MissingSideInputNamesTheKeyAndWhatExists) {
  MicroBatch mb{3, {{"labels", torch::zeros({1})}}};
  try {
    mb.Get("attention_mask");
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("attention_mask"), std::string::npos) << msg;
    EXPECT_NE(msg.find("labels"), std::string::npos) << msg;
  }
}

TEST(LayerTest, ShortTypeNameStripsNamespacesAndImpl) {
  EXPECT_EQ(ShortTypeName("torch::nn::LinearImpl"), "Linear");
  EXPECT_EQ(ShortTypeName("pp::models::TransformerBlock"), "TransformerBlock");
  EXPECT_EQ(ShortTypeName("Impl"), "Impl");
}

TEST(LayerTest, RunLayersChains) {
  std::vector<Layer> layers = {
      MakeFunctionLayer("Double", [](const torch::Tensor& x) { return x * 2; }),
      MakeFunctionLayer("AddOne", [](const torch::Tensor& x) { return x + 1; })};
  EXPECT_EQ(RunLayers(layers, {torch::tensor(3.0f)}, MicroBatch{})[0].item<float>(), 7.0f);
}

}  // namespace
}  // namespace pp
