#include "checkpoint/hf/llama_hf.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf/gpt2_hf.h"
#include "checkpoint/hf/hf_test_support.h"
#include "checkpoint/hf/safetensors.h"
#include "checkpoint/model/model_checkpoint.h"
#include "nlohmann/json.hpp"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace {

using hf_testing::Logits;
using hf_testing::TempPath;
using hf_testing::TinyLlama;

TEST(SafetensorsTest, RoundTripAndCorruptFiles) {
  SafetensorsFile file;
  file.metadata["format"] = "pt";
  file.tensors = {{"a", torch::randn({3, 4})},
                  {"b", torch::arange(5, torch::kLong)},
                  {"c", torch::randn({2}).to(torch::kBFloat16)},
                  {"empty", torch::zeros({0, 3})}};
  const std::string path = TempPath("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, file).ok());
  absl::StatusOr<SafetensorsFile> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->metadata, file.metadata);
  ASSERT_EQ(read->tensors.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(read->tensors[i].first, file.tensors[i].first);
    EXPECT_TRUE(torch::equal(read->tensors[i].second, file.tensors[i].second));
  }
  // The data starts 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(static_cast<uint8_t>(bytes[0]) % 8, 0);
  // Truncated data, a broken header, a too-long header length.
  std::ofstream(TempPath("short.safetensors"), std::ios::binary)
      << bytes.substr(0, bytes.size() - 4);
  EXPECT_NE(ReadSafetensors(TempPath("short.safetensors")).status().message().find("do not hold"),
            std::string::npos);
  std::string broken = bytes;
  broken[8] = '[';
  std::ofstream(TempPath("broken.safetensors"), std::ios::binary) << broken;
  EXPECT_NE(
      ReadSafetensors(TempPath("broken.safetensors")).status().message().find("not a JSON object"),
      std::string::npos);
  std::string huge = bytes;
  huge[6] = 1;
  std::ofstream(TempPath("huge.safetensors"), std::ios::binary) << huge;
  EXPECT_NE(
      ReadSafetensors(TempPath("huge.safetensors")).status().message().find("exceeds the file"),
      std::string::npos);
  SafetensorsFile twice;
  twice.tensors = {{"a", torch::zeros({1})}, {"a", torch::zeros({1})}};
  EXPECT_EQ(WriteSafetensors(TempPath("twice.safetensors"), twice).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LlamaHfTest, ExportImportRoundTripGivesTheSameLogits) {
  for (bool tied : {false, true}) {
    const LlamaConfig config = TinyLlama(tied);
    StageModule model = *BuildSequential(*MakeLlamaSpecs(config), 77);
    const std::string dir = TempPath(absl::StrCat("hf_", tied));
    ASSERT_TRUE(ExportLlamaModule(*model, config, dir).ok());
    absl::StatusOr<SafetensorsFile> hf = ReadSafetensors(dir + "/model.safetensors");
    ASSERT_TRUE(hf.ok());
    EXPECT_EQ(hf->tensors.size(), 1u + 2u * 9u + 1u + (tied ? 0u : 1u));
    EXPECT_EQ(hf->tensors[0].first, "model.embed_tokens.weight");
    // Through a pipe checkpoint: import saves one, a fresh model loads it.
    absl::StatusOr<LlamaConfig> imported = ImportLlamaHf(dir, TempPath(absl::StrCat("ck_", tied)));
    ASSERT_TRUE(imported.ok()) << imported.status();
    EXPECT_EQ(imported->num_kv_heads, 2);
    EXPECT_EQ(imported->rope_theta, 5000.0);
    EXPECT_EQ(imported->tie_embeddings, tied);
    StageModule fresh = *BuildSequential(*MakeLlamaSpecs(*imported), 5);
    ModelState state = ModelStateOfModule(*fresh);
    LoadOptions options;
    options.load_optimizer = false;
    absl::StatusOr<LoadReport> report = LoadCheckpoint(TempPath(absl::StrCat("ck_", tied)), state,
                                                       nullptr, CheckpointRank(), options);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->clean()) << report->Summary();
    const torch::Tensor ids = torch::randint(0, 300, {2, 9}, torch::kLong);
    EXPECT_TRUE(torch::equal(Logits(model, ids), Logits(fresh, ids)));
    // And back out of the checkpoint: the same tensors as the first export.
    ASSERT_TRUE(ExportLlamaCheckpoint(TempPath(absl::StrCat("ck_", tied)), config,
                                      TempPath(absl::StrCat("hf2_", tied)))
                    .ok());
    absl::StatusOr<SafetensorsFile> again =
        ReadSafetensors(TempPath(absl::StrCat("hf2_", tied)) + "/model.safetensors");
    ASSERT_TRUE(again.ok());
    for (size_t i = 0; i < hf->tensors.size(); ++i) {
      EXPECT_TRUE(torch::equal(hf->tensors[i].second, again->tensors[i].second))
          << hf->tensors[i].first;
    }
  }
}

TEST(Gpt2HfTest, ExportImportRoundTripGivesTheSameLogits) {
  const GptConfig config = {
      .vocab_size = 300, .context_length = 16, .width = 32, .num_heads = 4, .num_layers = 2};
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
  absl::StatusOr<GptConfig> imported = ImportGpt2Hf(dir, TempPath("gpt2_ck"));
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->mlp_ratio, 4);
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

TEST(LlamaHfTest, UnsupportedConfigsNameTheField) {
  auto error = [](const std::string& edit_key, const std::string& edit_value) {
    nlohmann::json j = nlohmann::json::parse(LlamaHfConfigJson(TinyLlama(false)));
    j[edit_key] = nlohmann::json::parse(edit_value);
    return std::string(LlamaConfigFromHfJson(j.dump()).status().message());
  };
  EXPECT_TRUE(LlamaConfigFromHfJson(LlamaHfConfigJson(TinyLlama(false))).ok());
  EXPECT_EQ(error("hidden_act", "\"gelu\""), "config.json: hidden_act (\"gelu\") must be \"silu\"");
  EXPECT_EQ(error("attention_bias", "true"), "config.json: attention_bias (true) must be false");
  EXPECT_EQ(error("model_type", "\"gpt2\""),
            "config.json: model_type (\"gpt2\") must be \"llama\"");
  EXPECT_EQ(error("num_key_value_heads", "3"),
            "llama.num_kv_heads (3) must divide llama.num_heads (4)");
  EXPECT_NE(error("rope_scaling", "{\"type\": \"linear\"}").find("rope_scaling"),
            std::string::npos);
}

}  // namespace
}  // namespace pp
