#include "models/llama/llama_hf.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/hf/hf_folder.h"
#include "checkpoint/hf/hf_json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace {

constexpr const char* kBlockNames[] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};

// (pipe name, HF name) for every tensor of `config`'s model.
std::vector<std::pair<std::string, std::string>> NamePairs(const LlamaModelConfig& config) {
  std::vector<std::pair<std::string, std::string>> pairs;
  pairs.emplace_back(
      config.tie_embeddings() ? "tied.embed.tok_embed.weight" : "layers.0.tok_embed.weight",
      "model.embed_tokens.weight");
  for (int64_t i = 0; i < config.num_layers(); ++i) {
    for (const char* name : kBlockNames) {
      pairs.emplace_back(absl::StrCat("layers.", i + 1, ".", name),
                         absl::StrCat("model.layers.", i, ".", name));
    }
  }
  pairs.emplace_back(absl::StrCat("layers.", config.num_layers() + 1, ".weight"),
                     "model.norm.weight");
  if (!config.tie_embeddings()) {
    pairs.emplace_back(absl::StrCat("layers.", config.num_layers() + 2, ".weight"),
                       "lm_head.weight");
  }
  return pairs;
}

}  // namespace

std::string LlamaHfConfigJson(const LlamaModelConfig& c) {
  nlohmann::ordered_json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", c.vocab_size()},
      {"hidden_size", c.width()},
      {"intermediate_size", c.intermediate_size()},
      {"num_hidden_layers", c.num_layers()},
      {"num_attention_heads", c.num_heads()},
      {"num_key_value_heads", c.num_kv_heads()},
      {"head_dim", c.width() / c.num_heads()},
      {"max_position_embeddings", c.context_length()},
      {"rms_norm_eps", c.norm_eps()},
      // Both spellings: transformers 5 reads rope_parameters, older releases
      // rope_theta.
      {"rope_theta", c.rope_theta()},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_theta()}}},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"attention_dropout", c.dropout()},
      {"tie_word_embeddings", c.tie_embeddings()},
      {"torch_dtype", "float32"},
  };
  return j.dump(2);
}

absl::StatusOr<LlamaModelConfig> LlamaConfigFromHfJson(const std::string& json_text) {
  PP_ASSIGN_OR_RETURN(const nlohmann::json j, ParseHfConfig(json_text, "llama"));
  LlamaModelConfig c;
  for (auto [field, set] : {std::pair<const char*, void (LlamaModelConfig::*)(int64_t)>{
                                "vocab_size", &LlamaModelConfig::set_vocab_size},
                            {"hidden_size", &LlamaModelConfig::set_width},
                            {"intermediate_size", &LlamaModelConfig::set_intermediate_size},
                            {"num_hidden_layers", &LlamaModelConfig::set_num_layers},
                            {"num_attention_heads", &LlamaModelConfig::set_num_heads},
                            {"max_position_embeddings", &LlamaModelConfig::set_context_length}}) {
    PP_ASSIGN_OR_RETURN(const int64_t value, HfIntField(j, field, 1, kMaxHfDim));
    (c.*set)(value);
  }
  PP_ASSIGN_OR_RETURN(const int64_t kv_heads,
                      HfIntField(j, "num_key_value_heads", 1, kMaxHfDim, c.num_heads()));
  c.set_num_kv_heads(kv_heads);
  PP_ASSIGN_OR_RETURN(const int64_t head_dim,
                      HfIntField(j, "head_dim", 1, kMaxHfDim, c.width() / c.num_heads()));
  if (head_dim * c.num_heads() != c.width()) {
    return HfFieldError("head_dim", head_dim, "must be hidden_size / num_attention_heads here");
  }
  PP_ASSIGN_OR_RETURN(const double norm_eps,
                      HfRealField(j, "rms_norm_eps", 1e-6, /*positive=*/true));
  c.set_norm_eps(norm_eps);
  PP_ASSIGN_OR_RETURN(double rope_theta, HfRealField(j, "rope_theta", 10000.0, /*positive=*/true));
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const auto& rope = j["rope_parameters"];
    PP_ASSIGN_OR_RETURN(const std::string rope_type, HfStringField(rope, "rope_type", "default"));
    if (rope_type != "default") {
      return HfFieldError("rope_parameters.rope_type", rope_type, "is not implemented (default)");
    }
    PP_ASSIGN_OR_RETURN(rope_theta, HfRealField(rope, "rope_theta", rope_theta, /*positive=*/true));
  }
  c.set_rope_theta(rope_theta);
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    return HfFieldError("rope_scaling", j["rope_scaling"], "is not implemented (null only)");
  }
  PP_ASSIGN_OR_RETURN(const std::string act, HfStringField(j, "hidden_act", "silu"));
  if (act != "silu") return HfFieldError("hidden_act", act, "must be \"silu\"");
  for (const char* field : {"attention_bias", "mlp_bias"}) {
    PP_ASSIGN_OR_RETURN(const bool bias, HfBoolField(j, field, false));
    if (bias) return HfFieldError(field, bias, "must be false");
  }
  PP_ASSIGN_OR_RETURN(const bool tied, HfBoolField(j, "tie_word_embeddings", false));
  c.set_tie_embeddings(tied);
  c.set_dropout(0.0);
  if (absl::Status s = ValidateLlamaModelConfig(c); !s.ok()) return s;
  return c;
}

absl::StatusOr<SafetensorsFile> LlamaToHfTensors(const LlamaModelConfig& config,
                                                 const std::map<std::string, torch::Tensor>& pipe) {
  SafetensorsFile out;
  out.metadata["format"] = "pt";
  const auto pairs = NamePairs(config);
  if (pipe.size() != pairs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has ", pipe.size(), " tensors; a LLaMA of this config has ", pairs.size()));
  }
  for (const auto& [pipe_name, hf_name] : pairs) {
    auto it = pipe.find(pipe_name);
    if (it == pipe.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model has no tensor ", pipe_name, " (for ", hf_name, ")"));
    }
    out.tensors.emplace_back(hf_name, it->second.detach().to(torch::kCPU));
  }
  return out;
}

absl::StatusOr<std::map<std::string, torch::Tensor>> LlamaFromHfTensors(
    const LlamaModelConfig& config, const SafetensorsFile& hf) {
  std::map<std::string, torch::Tensor> by_name(hf.tensors.begin(), hf.tensors.end());
  std::map<std::string, torch::Tensor> out;
  for (const auto& [pipe_name, hf_name] : NamePairs(config)) {
    auto it = by_name.find(hf_name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.safetensors has no tensor ", hf_name, " (for ", pipe_name, ")"));
    }
    out[pipe_name] = it->second;
    by_name.erase(it);
  }
  for (const auto& [name, tensor] : by_name) {
    // A tied checkpoint may still carry the head's copy; rotary buffers are
    // recomputed.
    const bool tied_copy = config.tie_embeddings() && name == "lm_head.weight";
    if (!tied_copy && !absl::EndsWith(name, "rotary_emb.inv_freq")) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.safetensors tensor ", name, " has no place in pipe's LLaMA"));
    }
  }
  return out;
}

absl::Status ExportLlamaModule(const torch::nn::Module& module, const LlamaModelConfig& config,
                               const std::string& hf_dir) {
  absl::StatusOr<SafetensorsFile> tensors = LlamaToHfTensors(config, ModuleParameters(module));
  if (!tensors.ok()) return tensors.status();
  return WriteHfFolder(hf_dir, {LlamaHfConfigJson(config), *std::move(tensors)});
}

absl::Status ExportLlamaCheckpoint(const std::string& checkpoint, const LlamaModelConfig& config,
                                   const std::string& hf_dir) {
  absl::StatusOr<std::vector<LayerSpec>> specs = MakeLlamaSpecs(config);
  if (!specs.ok()) return specs.status();
  return ExportCheckpointToHf(
      checkpoint, *specs, LlamaHfConfigJson(config),
      [&](const std::map<std::string, torch::Tensor>& pipe) {
        return LlamaToHfTensors(config, pipe);
      },
      hf_dir);
}

absl::Status LoadLlamaHfIntoModule(const std::string& hf_dir, const LlamaModelConfig& config,
                                   torch::nn::Module& module) {
  absl::StatusOr<HfFolder> folder = ReadHfFolder(hf_dir);
  if (!folder.ok()) return folder.status();
  absl::StatusOr<std::map<std::string, torch::Tensor>> tensors =
      LlamaFromHfTensors(config, folder->tensors);
  if (!tensors.ok()) return tensors.status();
  return CopyIntoModule(*tensors, hf_dir, module);
}

absl::StatusOr<LlamaModelConfig> ImportLlamaHf(const std::string& hf_dir, const std::string& root) {
  absl::StatusOr<HfFolder> folder = ReadHfFolder(hf_dir);
  if (!folder.ok()) return folder.status();
  absl::StatusOr<LlamaModelConfig> config = LlamaConfigFromHfJson(folder->config_json);
  if (!config.ok()) return config.status();
  absl::StatusOr<std::vector<LayerSpec>> specs = MakeLlamaSpecs(*config);
  if (!specs.ok()) return specs.status();
  if (absl::Status s = ImportHfToCheckpoint(
          hf_dir, folder->tensors, *specs,
          [&](const SafetensorsFile& hf) { return LlamaFromHfTensors(*config, hf); }, root);
      !s.ok()) {
    return s;
  }
  return *config;
}

}  // namespace pp
