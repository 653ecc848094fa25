#include "pipeline/partition/partitioner.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace pp {
namespace {

// A layer that counts how many of its kind are alive, to check that the
// `parameters` partitioner builds and frees one layer at a time.
class CountedLinear : public LayerImpl {
 public:
  CountedLinear(int64_t in, int64_t out) : LayerImpl("CountedLinear") {
    fc_ = register_module("fc", torch::nn::Linear(in, out));
    max_alive = std::max(max_alive, ++alive);
  }
  ~CountedLinear() override { --alive; }
  Activations Forward(const Activations& inputs, const MicroBatch&) override {
    return {fc_(inputs[0])};
  }

  static int alive;
  static int max_alive;

 private:
  torch::nn::Linear fc_{nullptr};
};
int CountedLinear::alive = 0;
int CountedLinear::max_alive = 0;

// A first layer that takes no input activations: it reads its input from the
// micro-batch (as a GPT's embedding reads input_ids).
class FromBatch : public LayerImpl {
 public:
  FromBatch() : LayerImpl("FromBatch") {}
  Activations Forward(const Activations&, const MicroBatch& batch) override {
    return {batch.Get("x") * 1.0};
  }
};

LayerSpec Fn(const std::string& name) {
  return LayerSpec(name, [name](const LayerContext&) {
    return MakeFunctionLayer(name, [](const torch::Tensor& x) { return x; });
  });
}

std::vector<LayerSpec> Functions(int n, const std::string& name = "Identity") {
  return std::vector<LayerSpec>(n, Fn(name));
}

absl::StatusOr<Bounds> PartitionBy(const std::string& method, const std::vector<LayerSpec>& specs,
                                   int64_t parts) {
  PartitionRequest request;
  request.specs = &specs;
  request.num_parts = parts;
  return Partition(method, request);
}

TEST(PartitionerRegistryTest, BuiltInsAreRegistered) {
  std::vector<std::string> names = RegisteredPartitioners();
  for (const char* name : {"uniform", "parameters", "type", "profile", "explicit"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  EXPECT_NE(PartitionerHelp().find("uniform: "), std::string::npos);
}

TEST(PartitionerRegistryTest, UnknownMethodListsRegisteredOnes) {
  absl::StatusOr<Bounds> bounds = PartitionBy("greedy", Functions(4), 2);
  ASSERT_EQ(bounds.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(bounds.status().message());
  EXPECT_NE(message.find("'greedy'"), std::string::npos) << message;
  EXPECT_NE(message.find("explicit, parameters, profile, type, uniform"), std::string::npos)
      << message;
}

TEST(PartitionerRegistryTest, DuplicateNameIsRejected) {
  auto fn = [](const PartitionRequest&) -> absl::StatusOr<Bounds> { return Bounds{0, 1}; };
  EXPECT_EQ(RegisterPartitioner("uniform", "again", fn).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(RegisterPartitioner("a:b", "colon", fn).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_DEATH(internal_partition::RegisterOrDie("uniform", "again", fn), "registered twice");
}

TEST(PartitionerRegistryTest, ResultsAreValidatedAgain) {
  ASSERT_TRUE(RegisterPartitioner("broken_for_test", "returns bad bounds",
                                  [](const PartitionRequest&) -> absl::StatusOr<Bounds> {
                                    return Bounds{0, 0, 3};
                                  })
                  .ok());
  EXPECT_EQ(PartitionBy("broken_for_test", Functions(3), 2).status().code(),
            absl::StatusCode::kInternal);
}

TEST(PartitionerRegistryTest, FewerLayersThanPartsNamesBothNumbers) {
  for (const char* method : {"uniform", "parameters", "type:Identity", "explicit:0,1,2,3"}) {
    absl::StatusOr<Bounds> bounds = PartitionBy(method, Functions(3), 4);
    ASSERT_EQ(bounds.status().code(), absl::StatusCode::kInvalidArgument) << method;
    EXPECT_NE(bounds.status().message().find("3 layers into 4 parts"), std::string::npos)
        << bounds.status();
  }
}

TEST(UniformPartitionerTest, FirstPartsGetOneMore) {
  EXPECT_EQ(*PartitionBy("uniform", Functions(10), 4), (Bounds{0, 3, 6, 8, 10}));
  EXPECT_EQ(PartitionBy("uniform:3", Functions(10), 4).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TypePartitionerTest, BalancesMatchingLayersCaseInsensitively) {
  std::vector<LayerSpec> specs = {Fn("Embedding")};
  for (int i = 0; i < 6; ++i) specs.push_back(Fn("TransformerBlock"));
  specs.push_back(Fn("LayerNorm"));
  specs.push_back(Fn("LmHead"));
  // Three blocks per part; the parameter-free layers ride along (earlier parts
  // take the zero-cost layers at a cut).
  EXPECT_EQ(*PartitionBy("type:transformerblock", specs, 2), (Bounds{0, 4, 9}));
  // Seven matches: 4 + 3, the earlier part taking the larger share.
  EXPECT_EQ(*PartitionBy("type:Block|Head", specs, 2), (Bounds{0, 5, 9}));
  EXPECT_EQ(*PartitionBy("type:^(Embedding|LmHead)$", specs, 2), (Bounds{0, 8, 9}));
}

TEST(TypePartitionerTest, Errors) {
  absl::StatusOr<Bounds> none = PartitionBy("type:Conv", Functions(4, "Linear"), 2);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("matches no layer"), std::string::npos) << none.status();
  EXPECT_NE(none.status().message().find("Linear"), std::string::npos) << none.status();
  EXPECT_EQ(PartitionBy("type:(", Functions(4), 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionBy("type", Functions(4), 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ExplicitPartitionerTest, AcceptsValidBoundsAndNamesBadOnes) {
  EXPECT_EQ(*PartitionBy("explicit:0,3,7,12", Functions(12), 3), (Bounds{0, 3, 7, 12}));
  struct Case {
    std::string method;
    std::string expect;
  };
  for (const Case& c : std::vector<Case>{{"explicit:0,3,7", "3 parts need 4"},
                                         {"explicit:0,3,7,11", "(12)"},
                                         {"explicit:1,3,7,12", "start at 0"},
                                         {"explicit:0,7,3,12", "strictly increasing"},
                                         {"explicit:0,3,x,12", "'x' is not an integer"},
                                         {"explicit", "needs bounds"}}) {
    absl::StatusOr<Bounds> bounds = PartitionBy(c.method, Functions(12), 3);
    ASSERT_EQ(bounds.status().code(), absl::StatusCode::kInvalidArgument) << c.method;
    EXPECT_NE(bounds.status().message().find(c.expect), std::string::npos) << bounds.status();
  }
}

TEST(ParametersPartitionerTest, BalancesCountsBuildingOneLayerAtATime) {
  // Linear(4, out) has 5 * out parameters: [20,20,60,20,20,20,20,20], built, not declared.
  std::vector<LayerSpec> specs;
  for (int64_t out : {4, 4, 12, 4, 4, 4, 4, 4}) {
    specs.push_back(LayerSpec(
        "Linear", [out](const LayerContext&) { return std::make_shared<CountedLinear>(4, out); }));
  }
  CountedLinear::alive = CountedLinear::max_alive = 0;
  EXPECT_EQ(*PartitionBy("parameters", specs, 4), (Bounds{0, 2, 3, 6, 8}));
  EXPECT_EQ(CountedLinear::max_alive, 1);
  EXPECT_EQ(CountedLinear::alive, 0);

  // Declared counts are used without building: [0,1,2,3,3,3] into 4.
  std::vector<LayerSpec> declared;
  for (int64_t count : {0, 1, 2, 3, 3, 3}) {
    declared.push_back(LayerSpec("Never", [](const LayerContext&) -> Layer {
                         throw std::runtime_error("built");
                       }).WithParameterCount(count));
  }
  EXPECT_EQ(*PartitionBy("parameters", declared, 4), (Bounds{0, 3, 4, 5, 6}));
}

TEST(ParametersPartitionerTest, CountsOnlyTrainableParameters) {
  std::vector<LayerSpec> specs = {
      LayerSpec("Frozen",
                [](const LayerContext&) {
                  Layer l = MakeModuleLayer(torch::nn::Linear(100, 100));
                  for (auto& p : l->parameters()) p.set_requires_grad(false);
                  return l;
                }),
      LayerSpec("Small",
                [](const LayerContext&) { return MakeModuleLayer(torch::nn::Linear(2, 2)); }),
      LayerSpec("Small",
                [](const LayerContext&) { return MakeModuleLayer(torch::nn::Linear(2, 2)); }),
  };
  // Frozen counts 0, so the two small layers are split: [Frozen, Small], [Small].
  EXPECT_EQ(*PartitionBy("parameters", specs, 2), (Bounds{0, 2, 3}));
}

TEST(ProfilePartitionerTest, GivesTheSlowLayerItsOwnPart) {
  at::set_num_threads(1);
  auto heavy = [](const LayerContext&) {
    return MakeFunctionLayer("Heavy", [](const torch::Tensor& x) {
      torch::Tensor y = x;
      for (int i = 0; i < 40; ++i) y = torch::tanh(torch::matmul(y, y.t()) / 64.0);
      return y;
    });
  };
  std::vector<LayerSpec> specs = {LayerSpec("Heavy", heavy), Fn("Cheap"), Fn("Cheap"), Fn("Cheap")};
  PartitionRequest request;
  request.specs = &specs;
  request.num_parts = 2;
  request.sample_inputs = {torch::randn({64, 64})};
  request.profile_repeats = 5;
  EXPECT_EQ(*Partition("profile", request), (Bounds{0, 1, 4}));

  request.sample_inputs.clear();
  absl::StatusOr<Bounds> missing = Partition("profile", request);
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("sample inputs"), std::string::npos);
}

TEST(ProfilePartitionerTest, FirstLayerMayReadOnlyTheSampleBatch) {
  at::set_num_threads(1);
  auto heavy = [](const LayerContext&) {
    return MakeFunctionLayer("Heavy", [](const torch::Tensor& x) {
      torch::Tensor y = x;
      for (int i = 0; i < 40; ++i) y = torch::tanh(torch::matmul(y, y.t()) / 64.0);
      return y;
    });
  };
  std::vector<LayerSpec> specs = {
      LayerSpec("FromBatch", [](const LayerContext&) { return std::make_shared<FromBatch>(); }),
      LayerSpec("Heavy", heavy), LayerSpec("Heavy", heavy), Fn("Cheap")};
  PartitionRequest request;
  request.specs = &specs;
  request.num_parts = 2;
  request.profile_repeats = 3;
  request.sample_batch.tensors["x"] = torch::randn({64, 64});
  EXPECT_EQ(*Partition("profile", request), (Bounds{0, 2, 4}));

  // The batch lacks what the first layer reads: the layer's error, named.
  request.sample_batch.tensors = {{"y", torch::randn({64, 64})}};
  absl::StatusOr<Bounds> wrong = Partition("profile", request);
  ASSERT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("profiling layer 0 ('FromBatch')"), std::string::npos)
      << wrong.status();
}

TEST(PartitionReportTest, ListsStagesChunksAndLayers) {
  std::vector<LayerSpec> specs = Functions(4, "Block");
  specs[0] = Fn("Embedding");
  const std::string report = PartitionReport(specs, {0, 1, 2, 3, 4}, 2, {10, 5, 5, 5});
  EXPECT_NE(report.find("stage=0 chunk=0 (part 0) layers=[0, 1) params=10\n     0: Embedding\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("stage=1 chunk=1 (part 3) layers=[3, 4) params=5\n     3: Block\n"),
            std::string::npos)
      << report;
}

TEST(VirtualStageTest, ChunkCOfStageSIsCTimesPPlusS) {
  EXPECT_EQ(VirtualStage(0, 0, 4), 0);
  EXPECT_EQ(VirtualStage(3, 0, 4), 3);
  EXPECT_EQ(VirtualStage(1, 2, 4), 9);
}

}  // namespace
}  // namespace pp
