// pipe's GPT (models/gpt) <-> Hugging Face GPT2LMHeadModel folders
// (config.json + model.safetensors).
//
//   tied.embed.tok_embed.weight      <-> transformer.wte.weight (lm_head tied to it)
//   tied.embed.pos_embed.weight      <-> transformer.wpe.weight
//   layers.<i+1>.ln1 / ln2           <-> transformer.h.<i>.ln_1 / ln_2
//   layers.<i+1>.attn.qkv.weight     <-> transformer.h.<i>.attn.c_attn.weight, transposed
//   layers.<i+1>.attn.q_bias, v_bias <-> the q and v thirds of c_attn.bias
//   layers.<i+1>.attn.proj           <-> transformer.h.<i>.attn.c_proj (weight transposed)
//   layers.<i+1>.mlp.fc_in / fc_out  <-> transformer.h.<i>.mlp.c_fc / c_proj (weights transposed)
//   layers.<N+1>.weight / bias       <-> transformer.ln_f.weight / bias
// GPT-2's Conv1D stores weights [in, out], the transpose of a Linear's. pipe's
// attention has no key bias: export writes zeros there, and import drops
// GPT-2's, which changes nothing (q . b_k is the same for every key of a
// query, and softmax ignores a per-row constant). pipe's MLP uses exact GELU,
// so the config says activation_function "gelu" (not GPT-2's "gelu_new").
#ifndef MODELS_GPT_GPT_HF_H_
#define MODELS_GPT_GPT_HF_H_

#include <string>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gpt/gpt.h"

namespace pp {

std::string Gpt2HfConfigJson(const GptModelConfig& config);
// InvalidArgument naming the field for what models/gpt does not implement.
absl::StatusOr<GptModelConfig> GptConfigFromHfJson(const std::string& json_text);

// Writes a ToSequential/BuildSequential GPT's parameters to `hf_dir`.
absl::Status ExportGptModule(const torch::nn::Module& module, const GptModelConfig& config,
                             const std::string& hf_dir);
// A pipe checkpoint of a GPT with `config` -> `hf_dir`.
absl::Status ExportGptCheckpoint(const std::string& checkpoint, const GptModelConfig& config,
                                 const std::string& hf_dir);
// Copies the folder's tensors into a GPT `module` built with `config`.
absl::Status LoadGpt2HfIntoModule(const std::string& hf_dir, const GptModelConfig& config,
                                  torch::nn::Module& module);
// The folder -> step 0 of a layer-wise pipe checkpoint under `root`; returns
// the folder's config with the fields it decides set (the shape and
// vocab_size, not dropout): the registration's import overrides.
absl::StatusOr<GptModelConfig> ImportGpt2Hf(const std::string& hf_dir, const std::string& root);

}  // namespace pp

#endif  // MODELS_GPT_GPT_HF_H_
