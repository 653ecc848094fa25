// pipe's LLaMA (models/llama) <-> Hugging Face LlamaForCausalLM folders
// (config.json + model.safetensors).
//
// Names: pipe's global names (pipeline/pipeline_model.h) map one to one:
//   layers.0.tok_embed.weight (untied) / tied.embed.tok_embed.weight (tied)
//                                      <-> model.embed_tokens.weight
//   layers.<i+1>.<block name>          <-> model.layers.<i>.<block name>
//                                          (models/llama uses HF's block names)
//   layers.<N+1>.weight                <-> model.norm.weight
//   layers.<N+2>.weight (untied only)  <-> lm_head.weight
// Layouts are the same ([out, in] Linear weights); q and k need no rotary
// permutation because models/llama rotates in HF's rotate-half layout (HF's
// conversion script permutes Meta's interleaved checkpoints into it).
//
// A pipe checkpoint is layer-wise (checkpoint/model/), so an import saved at
// one layout loads at any pp/dp layout. Thread-compatible free functions.
#ifndef MODELS_LLAMA_LLAMA_HF_H_
#define MODELS_LLAMA_LLAMA_HF_H_

#include <map>
#include <string>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/hf/safetensors.h"
#include "models/llama/llama.h"

namespace pp {

// config.json text for LlamaForCausalLM.
std::string LlamaHfConfigJson(const LlamaModelConfig& config);

// The LlamaModelConfig of a config.json. InvalidArgument naming the field for what
// models/llama does not implement (attention or MLP biases, an activation
// other than silu, rope scaling) or a missing field.
absl::StatusOr<LlamaModelConfig> LlamaConfigFromHfJson(const std::string& json_text);

// pipe global name -> HF name for every tensor of the model; InvalidArgument
// naming a tensor that has no HF counterpart or a missing one.
absl::StatusOr<SafetensorsFile> LlamaToHfTensors(const LlamaModelConfig& config,
                                                 const std::map<std::string, torch::Tensor>& pipe);
// The inverse (extra HF tensors such as rotary inv_freq buffers are ignored).
absl::StatusOr<std::map<std::string, torch::Tensor>> LlamaFromHfTensors(
    const LlamaModelConfig& config, const SafetensorsFile& hf);

// Writes `module`'s parameters (a ToSequential/BuildSequential LLaMA) to the
// folder `hf_dir` (created).
absl::Status ExportLlamaModule(const torch::nn::Module& module, const LlamaModelConfig& config,
                               const std::string& hf_dir);
// Loads a pipe checkpoint (a step directory or a root with `latest`) of a
// LLaMA with `config` and exports it.
absl::Status ExportLlamaCheckpoint(const std::string& checkpoint, const LlamaModelConfig& config,
                                   const std::string& hf_dir);

// Copies the folder's tensors into `module` (built from the folder's config,
// checked against `config`'s shapes).
absl::Status LoadLlamaHfIntoModule(const std::string& hf_dir, const LlamaModelConfig& config,
                                   torch::nn::Module& module);
// Reads the folder and saves it as step 0 of a pipe checkpoint under `root`;
// returns the folder's config with every field but the tokenizer set (the
// registration's import overrides).
absl::StatusOr<LlamaModelConfig> ImportLlamaHf(const std::string& hf_dir, const std::string& root);

}  // namespace pp

#endif  // MODELS_LLAMA_LLAMA_HF_H_
