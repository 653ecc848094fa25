// GPT <-> GPT2LMHeadModel folders (gpt_hf.h): export -> import gives the
// same logits, and unsupported or malformed config.json fields are refused
// naming the field.
#include "models/gpt/gpt_hf.h"
#include "models/config_testing.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/hf/hf_test_support.h"
#include "checkpoint/hf/safetensors.h"
#include "checkpoint/model/model_checkpoint.h"
#include "nlohmann/json.hpp"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace {

using hf_testing::Logits;
using hf_testing::TempPath;

TEST(Gpt2HfTest, ExportImportRoundTripGivesTheSameLogits) {
  const GptModelConfig config = ParseModelConfig<GptModelConfig>(
      "vocab_size: 300 context_length: 16 width: 32 num_heads: 4 num_layers: 2");
  StageModule model = *BuildSequential(*MakeGptSpecs(config), 77);
  const std::string dir = TempPath("gpt2");
  ASSERT_TRUE(ExportGptModule(*model, config, dir).ok());
  absl::StatusOr<SafetensorsFile> hf = ReadSafetensors(dir + "/model.safetensors");
  ASSERT_TRUE(hf.ok());
  // Conv1D layout: c_attn.weight is [width, 3 * width].
  for (const auto& [name, tensor] : hf->tensors) {
    if (name == "transformer.h.0.attn.c_attn.weight") {
      EXPECT_EQ(tensor.sizes(), (std::vector<int64_t>{32, 96}));
    }
  }
  absl::StatusOr<GptModelConfig> imported = ImportGpt2Hf(dir, TempPath("gpt2_ck"));
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->mlp_ratio(), 4);
  StageModule fresh = *BuildSequential(*MakeGptSpecs(*imported), 5);
  ModelState state = ModelStateOfModule(*fresh);
  LoadOptions options;
  options.load_optimizer = false;
  absl::StatusOr<LoadReport> report =
      LoadCheckpoint(TempPath("gpt2_ck"), state, nullptr, CheckpointRank(), options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->clean()) << report->Summary();
  const torch::Tensor ids = torch::randint(0, 300, {2, 9}, torch::kLong);
  EXPECT_TRUE(torch::equal(Logits(model, ids), Logits(fresh, ids)));
  nlohmann::json j = nlohmann::json::parse(Gpt2HfConfigJson(config));
  j["activation_function"] = "gelu_new";
  EXPECT_EQ(GptConfigFromHfJson(j.dump()).status().message(),
            "config.json: activation_function (\"gelu_new\") must be \"gelu\" (pipe's GPT uses "
            "exact GELU)");
}

// Issue #42 class 3: every config.json field read gets a type and range
// check. Each field the reader knows, set to a value of the wrong JSON type,
// is refused naming that field (it was an uncaught JSON type error); sizes of
// 0 are refused before they divide (n_embd 0 was a SIGFPE).
TEST(GptHfConfigTest, EveryFieldOfTheWrongTypeOrRangeIsNamed) {
  auto refusal = [](const std::string& text) {
    return std::string(GptConfigFromHfJson(text).status().message());
  };
  const GptModelConfig gpt = ParseModelConfig<GptModelConfig>(
      "vocab_size: 300 context_length: 16 width: 32 num_heads: 4 num_layers: 2");
  const nlohmann::json good = nlohmann::json::parse(Gpt2HfConfigJson(gpt));
  hf_testing::ExpectConfigFieldsChecked(refusal, good,
                                        {"n_inner", "layer_norm_epsilon", "scale_attn_weights"},
                                        {"architectures", "torch_dtype", "resid_pdrop",
                                         "embd_pdrop", "attn_pdrop", "initializer_range"},
                                        "n_embd");
}

}  // namespace
}  // namespace pp
