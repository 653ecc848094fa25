// The tiny LLaMA the Hugging Face converter's tests share: the shape
// checkpoint/hf/hf_check.py's transformers model has (GQA 4/2, vocabulary
// 300, context 16). Test-only.
#ifndef MODELS_LLAMA_LLAMA_HF_TESTING_H_
#define MODELS_LLAMA_LLAMA_HF_TESTING_H_

#include "models/config_testing.h"
#include "models/llama/llama.h"

namespace pp {
namespace hf_testing {

inline LlamaModelConfig TinyLlama(bool tied) {
  LlamaModelConfig c = ParseModelConfig<LlamaModelConfig>(
      "vocab_size: 300 context_length: 16 width: 32 num_heads: 4 num_kv_heads: 2 num_layers: 2 "
      "intermediate_size: 48 rope_theta: 5000.0");
  c.set_tie_embeddings(tied);
  return c;
}

}  // namespace hf_testing
}  // namespace pp

#endif  // MODELS_LLAMA_LLAMA_HF_TESTING_H_
