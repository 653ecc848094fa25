// The registry's Hugging Face section: a registration's HfConversion is found
// by the model_types it declares, its typed functions see the model's own
// config message, and a model_type declared by two models aborts.
#include "models/registry.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace pp {
namespace {

std::string last_export;

// A model whose config message is pp.ModelConfig itself (nothing to train;
// the registry only stores its functions).
internal_model::TypedModel<ModelConfig> FakeModel(const std::string& name,
                                                  const std::string& model_type) {
  internal_model::TypedModel<ModelConfig> m;
  m.name = name;
  m.description = "a model with a Hugging Face section, for the registry's test";
  m.specs = [](const ModelConfig&) -> absl::StatusOr<std::vector<LayerSpec>> {
    return std::vector<LayerSpec>{};
  };
  m.loss = [](const Activations&, const MicroBatch&) { return torch::zeros({}); };
  m.data = [](const ModelConfig&, const ModelRun&) -> absl::StatusOr<ModelData> {
    return ModelData{};
  };
  m.hf.model_types = {model_type};
  m.hf.import_folder = [](const std::string& hf_dir,
                          const std::string&) -> absl::StatusOr<ModelConfig> {
    if (hf_dir.empty()) return absl::InvalidArgumentError("no folder");
    return ModelConfig();
  };
  m.hf.export_checkpoint = [](const std::string& checkpoint, const ModelConfig&,
                              const std::string& hf_dir) {
    last_export = checkpoint + " -> " + hf_dir;
    return absl::OkStatus();
  };
  return m;
}

TEST(ModelRegistryTest, HfConversionIsFoundByItsModelTypes) {
  RegisterModel(internal_model::Erase(FakeModel("hf_fake", "fake_hf_type"), 9001));
  const ModelInfo* info = FindModelByHfType("fake_hf_type");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->name, "hf_fake");
  EXPECT_EQ(FindModelByHfType("hf_fake"), nullptr);  // a pipe name is not a model_type
  EXPECT_EQ(FindModelByHfType("gpt2"), nullptr);     // no model of pipe's is linked here

  absl::StatusOr<std::unique_ptr<google::protobuf::Message>> config =
      info->hf.import_folder("hf_dir", "root");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)->GetDescriptor(), ModelConfig::descriptor());
  EXPECT_EQ(info->hf.import_folder("", "root").status().message(), "no folder");
  ASSERT_TRUE(info->hf.export_checkpoint("ckpt", **config, "out").ok());
  EXPECT_EQ(last_export, "ckpt -> out");
}

TEST(ModelRegistryDeathTest, AModelTypeBelongsToOneModel) {
  RegisterModel(internal_model::Erase(FakeModel("hf_first", "shared_type"), 9002));
  EXPECT_DEATH(RegisterModel(internal_model::Erase(FakeModel("hf_second", "shared_type"), 9003)),
               "models 'hf_first' and 'hf_second' both import Hugging Face model_type "
               "'shared_type'");
}

}  // namespace
}  // namespace pp
