#include "models/gpt/gpt_hf.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf/hf_folder.h"
#include "checkpoint/hf/hf_json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace {

// (pipe name, HF name, transposed) of the tensors that map one to one.
struct Pair {
  std::string pipe;
  std::string hf;
  bool transposed;
};

std::vector<Pair> OneToOne(const GptModelConfig& config) {
  std::vector<Pair> pairs = {{"tied.embed.tok_embed.weight", "transformer.wte.weight", false},
                             {"tied.embed.pos_embed.weight", "transformer.wpe.weight", false}};
  for (int64_t i = 0; i < config.num_layers(); ++i) {
    const std::string p = absl::StrCat("layers.", i + 1, ".");
    const std::string h = absl::StrCat("transformer.h.", i, ".");
    for (const char* x : {"weight", "bias"}) {
      pairs.push_back({p + "ln1." + x, h + "ln_1." + x, false});
      pairs.push_back({p + "ln2." + x, h + "ln_2." + x, false});
    }
    pairs.push_back({p + "attn.qkv.weight", h + "attn.c_attn.weight", true});
    pairs.push_back({p + "attn.proj.weight", h + "attn.c_proj.weight", true});
    pairs.push_back({p + "attn.proj.bias", h + "attn.c_proj.bias", false});
    pairs.push_back({p + "mlp.fc_in.weight", h + "mlp.c_fc.weight", true});
    pairs.push_back({p + "mlp.fc_in.bias", h + "mlp.c_fc.bias", false});
    pairs.push_back({p + "mlp.fc_out.weight", h + "mlp.c_proj.weight", true});
    pairs.push_back({p + "mlp.fc_out.bias", h + "mlp.c_proj.bias", false});
  }
  const std::string f = absl::StrCat("layers.", config.num_layers() + 1, ".");
  pairs.push_back({f + "weight", "transformer.ln_f.weight", false});
  pairs.push_back({f + "bias", "transformer.ln_f.bias", false});
  return pairs;
}

absl::StatusOr<torch::Tensor> Find(const std::map<std::string, torch::Tensor>& tensors,
                                   const std::string& name, const std::string& source) {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    return absl::InvalidArgumentError(absl::StrCat(source, " has no tensor ", name));
  }
  return it->second;
}

absl::StatusOr<SafetensorsFile> ToHf(const GptModelConfig& config,
                                     const std::map<std::string, torch::Tensor>& pipe) {
  SafetensorsFile out;
  out.metadata["format"] = "pt";
  for (const Pair& pair : OneToOne(config)) {
    absl::StatusOr<torch::Tensor> t = Find(pipe, pair.pipe, "the model");
    if (!t.ok()) return t.status();
    torch::Tensor v = t->detach().to(torch::kCPU);
    out.tensors.emplace_back(pair.hf, pair.transposed ? v.t().contiguous() : v);
  }
  for (int64_t i = 0; i < config.num_layers(); ++i) {
    const std::string p = absl::StrCat("layers.", i + 1, ".attn.");
    absl::StatusOr<torch::Tensor> q = Find(pipe, p + "q_bias", "the model");
    absl::StatusOr<torch::Tensor> v = Find(pipe, p + "v_bias", "the model");
    if (!q.ok()) return q.status();
    if (!v.ok()) return v.status();
    // [q | k | v]: pipe has no key bias (see the header).
    out.tensors.emplace_back(absl::StrCat("transformer.h.", i, ".attn.c_attn.bias"),
                             torch::cat({q->detach(), torch::zeros_like(*q), v->detach()}));
  }
  return out;
}

absl::StatusOr<std::map<std::string, torch::Tensor>> FromHf(const GptModelConfig& config,
                                                            const SafetensorsFile& hf,
                                                            const std::string& source) {
  std::map<std::string, torch::Tensor> by_name(hf.tensors.begin(), hf.tensors.end());
  std::map<std::string, torch::Tensor> out;
  for (const Pair& pair : OneToOne(config)) {
    absl::StatusOr<torch::Tensor> t = Find(by_name, pair.hf, source);
    if (!t.ok()) return t.status();
    out[pair.pipe] = pair.transposed ? t->t().contiguous() : *t;
  }
  for (int64_t i = 0; i < config.num_layers(); ++i) {
    absl::StatusOr<torch::Tensor> bias =
        Find(by_name, absl::StrCat("transformer.h.", i, ".attn.c_attn.bias"), source);
    if (!bias.ok()) return bias.status();
    const int64_t w = config.width();
    const std::string p = absl::StrCat("layers.", i + 1, ".attn.");
    out[p + "q_bias"] = bias->slice(0, 0, w).clone();
    out[p + "v_bias"] = bias->slice(0, 2 * w, 3 * w).clone();
  }
  return out;
}

}  // namespace

std::string Gpt2HfConfigJson(const GptModelConfig& c) {
  nlohmann::ordered_json j = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", c.vocab_size()},
      {"n_positions", c.context_length()},
      {"n_embd", c.width()},
      {"n_layer", c.num_layers()},
      {"n_head", c.num_heads()},
      {"n_inner", c.mlp_ratio() * c.width()},
      {"activation_function", "gelu"},
      {"layer_norm_epsilon", 1e-5},
      {"resid_pdrop", c.dropout()},
      {"embd_pdrop", c.dropout()},
      {"attn_pdrop", c.dropout()},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
  };
  return j.dump(2);
}

absl::StatusOr<GptModelConfig> GptConfigFromHfJson(const std::string& json_text) {
  PP_ASSIGN_OR_RETURN(const nlohmann::json j, ParseHfConfig(json_text, "gpt2"));
  GptModelConfig c;
  for (auto [field, set] : {std::pair<const char*, void (GptModelConfig::*)(int64_t)>{
                                "vocab_size", &GptModelConfig::set_vocab_size},
                            {"n_positions", &GptModelConfig::set_context_length},
                            {"n_embd", &GptModelConfig::set_width},
                            {"n_layer", &GptModelConfig::set_num_layers},
                            {"n_head", &GptModelConfig::set_num_heads}}) {
    PP_ASSIGN_OR_RETURN(const int64_t value, HfIntField(j, field, 1, kMaxHfDim));
    (c.*set)(value);
  }
  PP_ASSIGN_OR_RETURN(const int64_t inner, HfIntField(j, "n_inner", 1, kMaxHfDim, 4 * c.width()));
  if (inner % c.width() != 0) {
    return HfFieldError("n_inner", inner, "must be a multiple of n_embd (pipe's mlp_ratio)");
  }
  c.set_mlp_ratio(inner / c.width());
  PP_ASSIGN_OR_RETURN(const std::string act, HfStringField(j, "activation_function", "gelu_new"));
  if (act != "gelu") {
    return HfFieldError("activation_function", act,
                        "must be \"gelu\" (pipe's GPT uses exact GELU)");
  }
  PP_ASSIGN_OR_RETURN(const double eps,
                      HfRealField(j, "layer_norm_epsilon", 1e-5, /*positive=*/true));
  if (eps != 1e-5) return HfFieldError("layer_norm_epsilon", eps, "must be 1e-05");
  for (const char* field : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"}) {
    PP_ASSIGN_OR_RETURN(const bool set, HfBoolField(j, field, false));
    if (set) return HfFieldError(field, set, "must be false");
  }
  for (const char* field : {"scale_attn_weights", "tie_word_embeddings"}) {
    PP_ASSIGN_OR_RETURN(const bool set, HfBoolField(j, field, true));
    if (!set) return HfFieldError(field, set, "must be true");
  }
  if (absl::Status s = ValidateGptModelConfig(c); !s.ok()) return s;
  return c;
}

absl::Status ExportGptModule(const torch::nn::Module& module, const GptModelConfig& config,
                             const std::string& hf_dir) {
  absl::StatusOr<SafetensorsFile> tensors = ToHf(config, ModuleParameters(module));
  if (!tensors.ok()) return tensors.status();
  return WriteHfFolder(hf_dir, {Gpt2HfConfigJson(config), *std::move(tensors)});
}

absl::Status ExportGptCheckpoint(const std::string& checkpoint, const GptModelConfig& config,
                                 const std::string& hf_dir) {
  absl::StatusOr<std::vector<LayerSpec>> specs = MakeGptSpecs(config);
  if (!specs.ok()) return specs.status();
  return ExportCheckpointToHf(
      checkpoint, *specs, Gpt2HfConfigJson(config),
      [&](const std::map<std::string, torch::Tensor>& pipe) { return ToHf(config, pipe); }, hf_dir);
}

absl::Status LoadGpt2HfIntoModule(const std::string& hf_dir, const GptModelConfig& config,
                                  torch::nn::Module& module) {
  absl::StatusOr<HfFolder> folder = ReadHfFolder(hf_dir);
  if (!folder.ok()) return folder.status();
  absl::StatusOr<std::map<std::string, torch::Tensor>> tensors =
      FromHf(config, folder->tensors, hf_dir);
  if (!tensors.ok()) return tensors.status();
  return CopyIntoModule(*tensors, hf_dir, module);
}

absl::StatusOr<GptModelConfig> ImportGpt2Hf(const std::string& hf_dir, const std::string& root) {
  absl::StatusOr<HfFolder> folder = ReadHfFolder(hf_dir);
  if (!folder.ok()) return folder.status();
  absl::StatusOr<GptModelConfig> config = GptConfigFromHfJson(folder->config_json);
  if (!config.ok()) return config.status();
  absl::StatusOr<std::vector<LayerSpec>> specs = MakeGptSpecs(*config);
  if (!specs.ok()) return specs.status();
  if (absl::Status s = ImportHfToCheckpoint(
          hf_dir, folder->tensors, *specs,
          [&](const SafetensorsFile& hf) { return FromHf(*config, hf, hf_dir); }, root);
      !s.ok()) {
    return s;
  }
  return *config;
}

}  // namespace pp
