// The battery every registered partitioner runs: a new method linked into
// this test (or registered here) is checked by looping over the registry.
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "pipeline/partition/partitioner.h"

namespace pp {
namespace {

// Registered through the macro, at static initialisation, like a plugin: it
// puts all but the last parts on single layers.
absl::StatusOr<Bounds> FrontSingles(const PartitionRequest& request) {
  const int64_t n = static_cast<int64_t>(request.specs->size());
  Bounds bounds;
  for (int64_t s = 0; s < request.num_parts; ++s) bounds.push_back(s);
  bounds.push_back(n);
  return bounds;
}
PP_REGISTER_PARTITIONER("front_singles_for_test", "test plugin", &FrontSingles);

// A mix of layer kinds and sizes: Linear blocks of varying width and
// parameter-free Gelu layers.
std::vector<LayerSpec> MixedSpecs(int64_t n) {
  std::vector<LayerSpec> specs;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 3 == 2) {
      specs.push_back(LayerSpec("Gelu", [](const LayerContext&) {
        return MakeFunctionLayer("Gelu", [](const torch::Tensor& x) { return torch::gelu(x); });
      }));
    } else {
      specs.push_back(LayerSpec(
          "Block", [](const LayerContext&) { return MakeModuleLayer(torch::nn::Linear(4, 4)); }));
    }
  }
  return specs;
}

// Methods that need an argument get a valid one for the request.
std::string MethodFor(const std::string& name, int64_t n, int64_t parts) {
  if (name == "type") return "type:block|gelu";
  if (name == "explicit") return "explicit:" + absl::StrJoin(*UniformBounds(n, parts), ",");
  return name;
}

PartitionRequest RequestFor(const std::vector<LayerSpec>& specs, int64_t parts) {
  PartitionRequest request;
  request.specs = &specs;
  request.num_parts = parts;
  request.sample_inputs = {torch::randn({2, 4})};
  request.profile_repeats = 1;
  return request;
}

TEST(PartitionerConformanceTest, EveryPartitionerReturnsValidBoundsForEverySplit) {
  at::set_num_threads(1);
  const std::vector<std::string> names = RegisteredPartitioners();
  ASSERT_GE(names.size(), 6u);
  for (const std::string& name : names) {
    for (int64_t n = 1; n <= 7; ++n) {
      const std::vector<LayerSpec> specs = MixedSpecs(n);
      for (int64_t parts = 1; parts <= n; ++parts) {
        const std::string method = MethodFor(name, n, parts);
        SCOPED_TRACE(method + " n=" + std::to_string(n) + " parts=" + std::to_string(parts));
        absl::StatusOr<Bounds> bounds = Partition(method, RequestFor(specs, parts));
        ASSERT_TRUE(bounds.ok()) << bounds.status();
        EXPECT_TRUE(ValidateBounds(*bounds, n, parts).ok()) << absl::StrJoin(*bounds, ",");
        if (name != "profile") {  // Timing-based: may differ between runs.
          EXPECT_EQ(*Partition(method, RequestFor(specs, parts)), *bounds) << "not deterministic";
        }
      }
    }
  }
}

TEST(PartitionerConformanceTest, EveryPartitionerRejectsMorePartsThanLayers) {
  const std::vector<LayerSpec> specs = MixedSpecs(3);
  for (const std::string& name : RegisteredPartitioners()) {
    absl::StatusOr<Bounds> bounds = Partition(MethodFor(name, 4, 4), RequestFor(specs, 4));
    ASSERT_EQ(bounds.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(bounds.status().message().find("3 layers into 4 parts"), std::string::npos)
        << bounds.status();
  }
}

TEST(PartitionerConformanceTest, PluginRegisteredByMacroIsUsable) {
  const std::vector<LayerSpec> specs = MixedSpecs(5);
  EXPECT_EQ(*Partition("front_singles_for_test", RequestFor(specs, 3)), (Bounds{0, 1, 2, 5}));
}

}  // namespace
}  // namespace pp
