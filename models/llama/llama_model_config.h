// The one conversion between the config message [pp.llama]
// (llama_config.proto) and the model's C++ LlamaConfig, both ways: the
// registration builds the model from the message, and its Hugging Face import
// (llama_hf.h) turns an imported config.json into the message.
#ifndef MODELS_LLAMA_LLAMA_MODEL_CONFIG_H_
#define MODELS_LLAMA_LLAMA_MODEL_CONFIG_H_

#include "models/llama/llama.h"
#include "models/llama/llama_config.pb.h"

namespace pp {

LlamaConfig ToLlamaConfig(const LlamaModelConfig& c);
// Every shape field set (the tokenizer is not part of LlamaConfig).
LlamaModelConfig ToLlamaModelConfig(const LlamaConfig& c);

}  // namespace pp

#endif  // MODELS_LLAMA_LLAMA_MODEL_CONFIG_H_
