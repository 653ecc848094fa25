#include "checkpoint/hf/llama_hf.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf/gpt2_hf.h"
#include "checkpoint/hf/hf_test_support.h"
#include "checkpoint/hf/safetensors.h"
#include "checkpoint/model/checkpoint_lock.h"
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

// A tiny LLaMA (seed 77) exported as the Hugging Face folder TempPath(name).
std::string ExportedTinyLlama(bool tied, const std::string& name) {
  const LlamaConfig config = TinyLlama(tied);
  StageModule model = *BuildSequential(*MakeLlamaSpecs(config), 77);
  const std::string dir = TempPath(name);
  EXPECT_TRUE(ExportLlamaModule(*model, config, dir).ok());
  return dir;
}

// Issue #42 class 3: a safetensors header is file contents, checked like a
// config field: an element count beyond int64 and two tensors sharing bytes
// are refused, not aborted on or read silently.
TEST(SafetensorsTest, RefusesOverflowingShapesAndOverlappingOffsets) {
  auto write = [](const std::string& name, const std::string& header, int data_bytes) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    bytes += header + std::string(data_bytes, '\0');
    std::ofstream(TempPath(name), std::ios::binary) << bytes;
    return std::string(ReadSafetensors(TempPath(name)).status().message());
  };
  EXPECT_NE(
      write("huge_shape.safetensors",
            R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8)
          .find("tensor a: shape [4294967296,4294967296] has more elements than any file"),
      std::string::npos);
  EXPECT_NE(write("huge_bytes.safetensors",
                  R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8)
                .find("has more bytes than any file can hold"),
            std::string::npos);
  EXPECT_NE(write("overlap.safetensors",
                  R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  12)
                .find("tensor b: data_offsets [4, 12] overlap those of tensor a [0, 8]"),
            std::string::npos);
  // Adjacent and empty tensors do not overlap.
  EXPECT_EQ(write("adjacent.safetensors",
                  R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                  12),
            "");
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
// check. Each field the readers know, set to a value of the wrong JSON type,
// is refused naming that field (it was an uncaught JSON type error); sizes of
// 0 are refused before they divide (GPT-2 n_embd 0 was a SIGFPE).
TEST(HfConfigTest, EveryFieldOfTheWrongTypeOrRangeIsNamed) {
  auto refusal = [](const std::string& text, bool gpt2) {
    return std::string(gpt2 ? GptConfigFromHfJson(text).status().message()
                            : LlamaConfigFromHfJson(text).status().message());
  };
  const GptConfig gpt = {
      .vocab_size = 300, .context_length = 16, .width = 32, .num_heads = 4, .num_layers = 2};
  for (const bool gpt2 : {false, true}) {
    const nlohmann::json good =
        nlohmann::json::parse(gpt2 ? Gpt2HfConfigJson(gpt) : LlamaHfConfigJson(TinyLlama(false)));
    ASSERT_EQ(refusal(good.dump(), gpt2), "");
    std::vector<std::string> fields = {"rope_theta", "rms_norm_eps", "n_inner",
                                       "layer_norm_epsilon", "scale_attn_weights"};
    for (const auto& [key, value] : good.items()) fields.push_back(key);
    for (const std::string& field : fields) {
      const bool known = good.contains(field);
      if (!known && (field == "n_inner" || field == "layer_norm_epsilon" ||
                     field == "scale_attn_weights") != gpt2) {
        continue;
      }
      if (field == "architectures" || field == "torch_dtype" || field == "rope_parameters" ||
          field == "attention_dropout" || field == "resid_pdrop" || field == "embd_pdrop" ||
          field == "attn_pdrop" || field == "initializer_range") {
        continue;  // not read
      }
      nlohmann::json j = good;
      j[field] = (known && good[field].is_string()) ? nlohmann::json(7) : nlohmann::json("two");
      EXPECT_NE(refusal(j.dump(), gpt2).find("config.json: " + field + " ("), std::string::npos)
          << field << ": " << refusal(j.dump(), gpt2);
    }
    const char* width = gpt2 ? "n_embd" : "hidden_size";
    nlohmann::json zero = good;
    zero[width] = 0;
    EXPECT_NE(refusal(zero.dump(), gpt2)
                  .find(std::string("config.json: ") + width +
                        " (0) must be an integer in [1, 1073741824]"),
              std::string::npos);
    nlohmann::json huge = good;
    huge["vocab_size"] = 18446744073709551615ull;
    EXPECT_NE(refusal(huge.dump(), gpt2).find("config.json: vocab_size (18446744073709551615)"),
              std::string::npos);
  }
  nlohmann::json j = nlohmann::json::parse(LlamaHfConfigJson(TinyLlama(false)));
  j["rope_parameters"]["rope_theta"] = "x";
  EXPECT_EQ(refusal(j.dump(), false),
            "config.json: rope_theta (\"x\") must be a finite number > 0");
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
