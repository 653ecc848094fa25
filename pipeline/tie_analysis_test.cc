#include "pipeline/tie_analysis.h"

#include "gtest/gtest.h"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace {

// An output projection that reuses a given weight (e.g. the token embedding's
// table): the ordinary LibTorch way of tying, one tensor registered twice.
class TiedHeadImpl : public torch::nn::Module {
 public:
  explicit TiedHeadImpl(torch::Tensor weight) {
    weight_ = register_parameter("weight", std::move(weight));
  }
  torch::Tensor forward(torch::Tensor x) { return torch::matmul(x, weight_.t()); }

 private:
  torch::Tensor weight_;
};
TORCH_MODULE(TiedHead);

struct TinyLmImpl : torch::nn::Module {
  TinyLmImpl() {
    embed = register_module("embed", torch::nn::Embedding(10, 6));
    mlp = register_module("mlp", torch::nn::Linear(6, 6));
    head = register_module("head", TiedHead(embed->weight));
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear mlp{nullptr};
  TiedHead head{nullptr};
};
TORCH_MODULE(TinyLm);

TEST(FindTiedParametersTest, GroupsParametersThatShareATensor) {
  TinyLm lm;
  EXPECT_EQ(FindTiedParameters(*lm),
            (std::vector<std::vector<std::string>>{{"embed.weight", "head.weight"}}));
  // A copy breaks the sharing: analysis must run before any copy.
  torch::nn::Linear untied(6, 6);
  EXPECT_TRUE(FindTiedParameters(*untied).empty());
}

TEST(FindTiedParametersTest, AViewWithOtherGeometryIsNotTheSameParameter) {
  torch::nn::Module m;
  torch::Tensor w = torch::randn({4, 4});
  m.register_parameter("a", w);
  m.register_parameter("b", w.t());
  EXPECT_TRUE(FindTiedParameters(m).empty());
}

torch::nn::Sequential TinySequential() {
  torch::manual_seed(3);
  torch::nn::Embedding embed(10, 6);
  return torch::nn::Sequential(embed, torch::nn::Linear(6, 6), torch::nn::Functional(torch::tanh),
                               TiedHead(embed->weight));
}

TEST(SpecsFromSequentialTest, SharedParametersBecomeOneTieGroup) {
  torch::nn::Sequential seq = TinySequential();
  ASSERT_EQ(FindTiedParameters(*seq),
            (std::vector<std::vector<std::string>>{{"0.weight", "3.weight"}}));
  const torch::Tensor tokens = torch::tensor({{1, 2, 3}, {4, 5, 9}});
  const torch::Tensor expected = seq->forward(tokens);

  absl::StatusOr<std::vector<LayerSpec>> specs = SpecsFromSequential(seq);
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 4u);
  EXPECT_TRUE((*specs)[0].is_tied());
  EXPECT_FALSE((*specs)[1].is_tied());
  EXPECT_EQ((*specs)[1].name(), "Linear");
  EXPECT_TRUE((*specs)[3].is_tied());
  EXPECT_EQ((*specs)[0].tie_key(), (*specs)[3].tie_key());
  EXPECT_EQ((*specs)[3].name(), "TiedHead");
  EXPECT_EQ((*specs)[1].declared_parameter_count(), 42);

  PipelineModelOptions options;
  options.num_stages = 2;
  options.partition_method = "uniform";
  std::vector<TieGroup> reported;
  Activations x = {tokens};
  for (int64_t stage = 0; stage < 2; ++stage) {
    auto model = PipelineModel::Create(*specs, options, stage);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_EQ((*model)->tie_groups().size(), 1u);
    reported.push_back((*model)->tie_groups()[0]);
    x = (*model)->chunk(0)->Forward(x, MicroBatch{});
  }
  for (const TieGroup& group : reported) {
    EXPECT_EQ(group.key, "shared_0");
    EXPECT_EQ(group.stages, (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(group.layer_indices, (std::vector<int64_t>{0, 3}));
    EXPECT_EQ(group.param_names, (std::vector<std::string>{"tied.shared_0.0.weight"}));
  }
  EXPECT_TRUE(torch::equal(x[0], expected));
}

TEST(SpecsFromSequentialTest, SequentialBuildHasOneSharedParameterAndMatchesTheOriginal) {
  torch::nn::Sequential seq = TinySequential();
  const torch::Tensor tokens = torch::tensor({{1, 2, 3}, {4, 5, 9}});
  const torch::Tensor expected = seq->forward(tokens);
  auto specs = *SpecsFromSequential(seq);
  StageModule built = *BuildSequential(specs, /*base_seed=*/0);
  const auto params = built->named_parameters();
  EXPECT_EQ(params.keys(), (std::vector<std::string>{"layers.1.weight", "layers.1.bias",
                                                     "tied.shared_0.0.weight"}));
  torch::Tensor out = built->Forward({tokens}, MicroBatch{})[0];
  EXPECT_TRUE(torch::equal(out, expected));
  // The one tensor gets both uses' gradients.
  out.sum().backward();
  EXPECT_TRUE(params["tied.shared_0.0.weight"].grad().defined());
  EXPECT_TRUE(seq[0]->named_parameters()["weight"].is_same(params["tied.shared_0.0.weight"]));
}

TEST(SpecsFromSequentialTest, EmptySequentialIsAnError) {
  EXPECT_EQ(SpecsFromSequential(torch::nn::Sequential()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pp
