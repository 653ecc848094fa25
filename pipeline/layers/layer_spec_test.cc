#include "pipeline/layers/layer_spec.h"

#include "gtest/gtest.h"

namespace pp {
namespace {

Layer SmallLinear(const LayerContext&) { return MakeModuleLayer(torch::nn::Linear(3, 2)); }

TEST(LayerSpecTest, TiedSpecKeepsItsTieInfoInAPlainSpecList) {
  std::vector<LayerSpec> specs = {
      TiedLayerSpec("embed", SmallLinear),
      LayerSpec("Linear", SmallLinear).WithParameterCount(8),
      TiedLayerSpec("embed", SmallLinear, TiedProjection(), {"weight"}).WithName("Head"),
  };
  EXPECT_TRUE(specs[0].is_tied());
  EXPECT_EQ(specs[0].name(), "embed");
  EXPECT_FALSE(specs[1].is_tied());
  EXPECT_EQ(specs[1].declared_parameter_count(), 8);
  EXPECT_EQ(specs[2].name(), "Head");
  EXPECT_EQ(specs[2].tied_param_names(), (std::vector<std::string>{"weight"}));
  EXPECT_TRUE(specs[2].tied_forward_fn() != nullptr);
  EXPECT_EQ(TiePositions(specs), (std::map<std::string, std::vector<int64_t>>{{"embed", {0, 2}}}));
  EXPECT_TRUE(ValidateSpecs(specs).ok());
}

TEST(LayerSpecTest, ValidateSpecsNamesTheBadEntry) {
  EXPECT_NE(ValidateSpecs({}).message().find("empty"), std::string::npos);
  EXPECT_NE(ValidateSpecs({LayerSpec("A", SmallLinear), LayerSpec("B", nullptr)})
                .message()
                .find("layer spec 1 ('B')"),
            std::string::npos);
  EXPECT_NE(ValidateSpecs({TiedLayerSpec("a.b", SmallLinear)}).message().find("'a.b'"),
            std::string::npos);
  EXPECT_FALSE(ValidateSpecs({TiedLayerSpec("", SmallLinear)}).ok());
}

TEST(LayerSpecTest, BuildSeededIsDeterministicAndRestoresTheRng) {
  torch::manual_seed(5);
  const torch::Tensor expected = torch::rand({3});
  torch::manual_seed(5);
  Layer a = BuildSeeded(MakeLayerContext({}, 0, 42), SmallLinear);
  EXPECT_TRUE(torch::equal(torch::rand({3}), expected));
  Layer b = BuildSeeded(MakeLayerContext({}, 0, 42), SmallLinear);
  Layer c = BuildSeeded(MakeLayerContext({}, 0, 43), SmallLinear);
  EXPECT_TRUE(torch::equal(a->named_parameters()["weight"], b->named_parameters()["weight"]));
  EXPECT_FALSE(torch::equal(a->named_parameters()["weight"], c->named_parameters()["weight"]));
}

TEST(LayerSpecTest, TheFactorySeesItsContextAndItsSeededRng) {
  LayerEnvironment environment;
  environment.model_parallel.rank = 1;
  environment.model_parallel.size = 2;
  environment.param_dtype = torch::kBFloat16;
  LayerContext seen;
  torch::Tensor drawn;
  auto factory = [&](const LayerContext& context) {
    seen = context;
    drawn = torch::rand({4}, context.rng);
    return SmallLinear(context);
  };
  BuildSpecLayer(LayerSpec("Linear", factory), 3, 100, environment);
  EXPECT_EQ(seen.global_index, 3);
  EXPECT_EQ(seen.seed, 103u);
  EXPECT_EQ(seen.model_parallel.rank, 1);
  EXPECT_EQ(seen.model_parallel.size, 2);
  EXPECT_EQ(seen.param_dtype, torch::kBFloat16);
  EXPECT_EQ(DescribeModelParallel(seen.model_parallel), "tp rank 1 of 2");
  // ctx.rng is the seeded default generator: the same draw as after manual_seed.
  torch::manual_seed(103);
  EXPECT_TRUE(torch::equal(drawn, torch::rand({4})));
  EXPECT_EQ(DescribeModelParallel(DenseEnvironment(environment).model_parallel), "dense");
  EXPECT_EQ(DenseEnvironment(environment).param_dtype, torch::kBFloat16);
}

TEST(LayerSpecTest, CountsTrainableParametersOnce) {
  torch::nn::Module m;
  torch::Tensor w = torch::ones({2, 3}, torch::requires_grad());
  m.register_parameter("a", w);
  m.register_parameter("b", w);  // The same tensor twice counts once.
  m.register_parameter("frozen", torch::ones({5}), /*requires_grad=*/false);
  EXPECT_EQ(CountTrainableParameters(m), 6);
  EXPECT_EQ(SpecParameterCount(LayerSpec("Linear", SmallLinear), 0, 0), 8);
  EXPECT_EQ(SpecParameterCount(LayerSpec("Linear", SmallLinear).WithParameterCount(99), 0, 0), 99);
}

TEST(TiedLayerTest, RunsTheSharedModuleDirectlyOrThroughForwardFn) {
  Layer embedding = MakeModuleLayer(torch::nn::Embedding(5, 3));
  TiedLayer lookup("Embedding", "embed", embedding, nullptr);
  TiedLayer head("LmHead", "embed", embedding, TiedProjection("weight"));
  torch::Tensor x = lookup.Forward({torch::tensor({1, 4})}, MicroBatch{})[0];
  torch::Tensor logits = head.Forward({x}, MicroBatch{})[0];
  const torch::Tensor table = embedding->named_parameters()["weight"];
  EXPECT_TRUE(torch::equal(logits, torch::matmul(x, table.t())));
  EXPECT_EQ(head.TypeName(), "LmHead");
  EXPECT_TRUE(head.parameters().empty()) << "the shared module is not registered on the tied layer";
  TiedLayer bad("LmHead", "embed", embedding, TiedProjection("bias"));
  EXPECT_THROW(bad.Forward({x}, MicroBatch{}), c10::Error);
}

}  // namespace
}  // namespace pp
