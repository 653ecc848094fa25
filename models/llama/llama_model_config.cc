#include "models/llama/llama_model_config.h"

namespace pp {

LlamaConfig ToLlamaConfig(const LlamaModelConfig& c) {
  return LlamaConfig{.vocab_size = c.vocab_size(),
                     .context_length = c.context_length(),
                     .width = c.width(),
                     .num_heads = c.num_heads(),
                     .num_kv_heads = c.num_kv_heads(),
                     .num_layers = c.num_layers(),
                     .intermediate_size = c.intermediate_size(),
                     .rope_theta = c.rope_theta(),
                     .norm_eps = c.norm_eps(),
                     .dropout = c.dropout(),
                     .tie_embeddings = c.tie_embeddings()};
}

LlamaModelConfig ToLlamaModelConfig(const LlamaConfig& c) {
  LlamaModelConfig m;
  m.set_vocab_size(c.vocab_size);
  m.set_context_length(c.context_length);
  m.set_width(c.width);
  m.set_num_heads(c.num_heads);
  m.set_num_kv_heads(c.num_kv_heads);
  m.set_num_layers(c.num_layers);
  m.set_intermediate_size(c.intermediate_size);
  m.set_rope_theta(c.rope_theta);
  m.set_norm_eps(c.norm_eps);
  m.set_dropout(c.dropout);
  m.set_tie_embeddings(c.tie_embeddings);
  return m;
}

}  // namespace pp
