// LLaMA <-> LlamaForCausalLM folders (llama_hf.h): export -> import gives
// the same logits (tied and untied), unsupported or malformed config.json
// fields are refused naming the field, and an import refuses a used
// checkpoint directory, non-finite weights and a FIFO.
#include "models/llama/llama_hf.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf/hf_test_support.h"
#include "checkpoint/hf/safetensors.h"
#include "checkpoint/model/checkpoint_lock.h"
#include "checkpoint/model/model_checkpoint.h"
#include "models/llama/llama_hf_testing.h"
#include "nlohmann/json.hpp"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace {

using hf_testing::Logits;
using hf_testing::TempPath;
using hf_testing::TinyLlama;

TEST(LlamaHfTest, ExportImportRoundTripGivesTheSameLogits) {
  for (bool tied : {false, true}) {
    const LlamaModelConfig config = TinyLlama(tied);
    StageModule model = *BuildSequential(*MakeLlamaSpecs(config), 77);
    const std::string dir = TempPath(absl::StrCat("hf_", tied));
    ASSERT_TRUE(ExportLlamaModule(*model, config, dir).ok());
    absl::StatusOr<SafetensorsFile> hf = ReadSafetensors(dir + "/model.safetensors");
    ASSERT_TRUE(hf.ok());
    EXPECT_EQ(hf->tensors.size(), 1u + 2u * 9u + 1u + (tied ? 0u : 1u));
    EXPECT_EQ(hf->tensors[0].first, "model.embed_tokens.weight");
    // Through a pipe checkpoint: import saves one, a fresh model loads it.
    absl::StatusOr<LlamaModelConfig> imported =
        ImportLlamaHf(dir, TempPath(absl::StrCat("ck_", tied)));
    ASSERT_TRUE(imported.ok()) << imported.status();
    EXPECT_EQ(imported->num_kv_heads(), 2);
    EXPECT_EQ(imported->rope_theta(), 5000.0);
    EXPECT_EQ(imported->tie_embeddings(), tied);
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

// A tiny LLaMA (seed 77) exported as the Hugging Face folder TempPath(name).
std::string ExportedTinyLlama(bool tied, const std::string& name) {
  const LlamaModelConfig config = TinyLlama(tied);
  StageModule model = *BuildSequential(*MakeLlamaSpecs(config), 77);
  const std::string dir = TempPath(name);
  EXPECT_TRUE(ExportLlamaModule(*model, config, dir).ok());
  return dir;
}

// Issue #42 class 1: an import wrote step 0 into a run's checkpoint dir and
// pointed `latest` at it; the run's resume=auto then continued from the
// import. Refused like a fresh training run: a dir with checkpoints, or one a
// live run holds.
TEST(HfImportTest, RefusesADirectoryWithCheckpointsOrALiveLock) {
  const std::string dir = ExportedTinyLlama(false, "hf_for_used_dir");
  const std::string used = TempPath("used_ck");
  ASSERT_TRUE(ImportLlamaHf(dir, used).ok());
  const absl::Status again = ImportLlamaHf(dir, used).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("cannot import into " + used + ": checkpoint dir " + used +
                                 " already holds 1 checkpoint(s), the newest step_00000000"),
            std::string::npos)
      << again;
  const std::string held = TempPath("held_ck");
  absl::StatusOr<std::unique_ptr<CheckpointDirLock>> lock =
      CheckpointDirLock::Acquire(held, ThisProcessAsHolder("run-1", "owner-1"));
  ASSERT_TRUE(lock.ok()) << lock.status();
  const absl::Status locked = ImportLlamaHf(dir, held).status();
  EXPECT_EQ(locked.code(), absl::StatusCode::kFailedPrecondition) << locked;
  EXPECT_NE(locked.message().find("run 'run-1'"), std::string::npos) << locked;
  lock->reset();
  EXPECT_FALSE(std::filesystem::exists(held + "/latest"));
}

// Issue #42 class 3: every config.json field read gets a type and range
// check. Each field the reader knows, set to a value of the wrong JSON type,
// is refused naming that field (it was an uncaught JSON type error); sizes of
// 0 are refused before they divide.
TEST(LlamaHfConfigTest, EveryFieldOfTheWrongTypeOrRangeIsNamed) {
  auto refusal = [](const std::string& text) {
    return std::string(LlamaConfigFromHfJson(text).status().message());
  };
  const nlohmann::json good = nlohmann::json::parse(LlamaHfConfigJson(TinyLlama(false)));
  hf_testing::ExpectConfigFieldsChecked(
      refusal, good, {"rope_theta", "rms_norm_eps"},
      {"architectures", "torch_dtype", "rope_parameters", "attention_dropout", "initializer_range"},
      "hidden_size");
  nlohmann::json j = good;
  j["rope_parameters"]["rope_theta"] = "x";
  EXPECT_EQ(refusal(j.dump()), "config.json: rope_theta (\"x\") must be a finite number > 0");
}

// Issue #42 class 6: a NaN weight was imported, and the fine-tune blamed a
// gradient of another tensor. Refused naming the tensor; so is a FIFO in the
// folder (class 4), without blocking.
TEST(HfImportTest, RefusesNonFiniteWeightsAndFifos) {
  const std::string dir = ExportedTinyLlama(true, "hf_nan");
  absl::StatusOr<SafetensorsFile> hf = ReadSafetensors(dir + "/model.safetensors");
  ASSERT_TRUE(hf.ok());
  for (auto& [name, tensor] : hf->tensors) {
    if (name == "model.norm.weight") tensor[3] = std::numeric_limits<float>::infinity();
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", *hf).ok());
  const absl::Status nan = ImportLlamaHf(dir, TempPath("nan_ck")).status();
  EXPECT_NE(nan.message().find(dir + ": layers.3.weight holds 1 non-finite value(s)"),
            std::string::npos)
      << nan;
  EXPECT_FALSE(std::filesystem::exists(TempPath("nan_ck") + "/latest"));
  const std::string fifo_dir = TempPath("hf_fifo");
  std::filesystem::create_directories(fifo_dir);
  ASSERT_EQ(::mkfifo((fifo_dir + "/config.json").c_str(), 0600), 0);
  EXPECT_NE(ImportLlamaHf(fifo_dir, TempPath("fifo_ck")).status().message().find("is a FIFO"),
            std::string::npos);
}

}  // namespace
}  // namespace pp
