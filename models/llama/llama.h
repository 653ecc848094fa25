// A LLaMA-style decoder as a pipeline spec list (models/README.md).
//
//   LlamaEmbedding           token embedding (no position table: positions
//                            enter through rotary embeddings in attention)
//   N x LlamaBlock           x + attn(rms(x)), then x + swiglu(rms(x)); causal
//                            grouped-query attention with rotary q and k
//   FinalRmsNorm
//   LmHead                   untied Linear(width -> vocab), LLaMA's default;
//                            with tie_embeddings, TiedLayerSpec("embed")
//                            projecting through the token table
//
// Parameter names inside a block follow Hugging Face's LlamaDecoderLayer
// ("self_attn.q_proj.weight", "mlp.gate_proj.weight", "input_layernorm.weight",
// ...) and rotary embeddings use its rotate-half convention (dimension i pairs
// with i + head_dim / 2), so a checkpoint maps onto LlamaForCausalLM without
// permuting q or k (the permutation HF's conversion script applies is for
// Meta's interleaved-pair checkpoints, not for this layout).
//
// The first stage reads "input_ids" [b, T]; the last stage outputs logits
// [b, T, vocab]; the loss is GPT's next-token cross-entropy (LlamaLoss).
// `type:LlamaBlock` partitions on block boundaries.
#ifndef MODELS_LLAMA_LLAMA_H_
#define MODELS_LLAMA_LLAMA_H_

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_spec.h"

namespace pp {

struct LlamaConfig {
  int64_t vocab_size = 260;
  int64_t context_length = 128;  // longest sequence a forward accepts
  int64_t width = 128;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 4;  // grouped-query attention: divides num_heads
  int64_t num_layers = 4;
  int64_t intermediate_size = 344;  // SwiGLU hidden width
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  double dropout = 0.0;  // on attention weights, block outputs and embeddings
  bool tie_embeddings = false;
};

// InvalidArgument naming the bad field and value: sizes positive, width a
// multiple of num_heads with an even head width (rotary pairs), num_kv_heads
// dividing num_heads, rope_theta > 1, norm_eps > 0, dropout in [0, 1).
absl::Status ValidateLlamaConfig(const LlamaConfig& config);

// x * rsqrt(mean(x^2) + eps) * weight over the last dimension, computed in
// float32 and cast back (as Hugging Face's LlamaRMSNorm does). Parameter
// "weight" [width], initialised to ones.
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t width, double eps);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

// cos and sin tables [time, head_dim] for positions 0..time-1 (rotate-half
// layout: the head_dim / 2 frequencies theta^(-2i/head_dim) twice), float32.
std::pair<torch::Tensor, torch::Tensor> RotaryTables(int64_t time, int64_t head_dim, double theta,
                                                     const torch::Device& device);

// Rotates x [..., time, head_dim] by the tables: x * cos + rotate_half(x) * sin,
// where rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2]).
torch::Tensor ApplyRotary(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin);

// Causal grouped-query self-attention over x [b, T, width]: q_proj width ->
// heads * head_dim, k_proj and v_proj width -> kv_heads * head_dim, o_proj
// back, no biases; query head h reads kv head h / (heads / kv_heads).
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear q_proj{nullptr};
  torch::nn::Linear k_proj{nullptr};
  torch::nn::Linear v_proj{nullptr};
  torch::nn::Linear o_proj{nullptr};

 private:
  int64_t num_heads_;
  int64_t num_kv_heads_;
  int64_t head_dim_;
  double rope_theta_;
  torch::nn::Dropout attn_dropout_{nullptr};
};
TORCH_MODULE(LlamaAttention);

// down_proj(silu(gate_proj(x)) * up_proj(x)), no biases.
class SwiGluImpl : public torch::nn::Module {
 public:
  SwiGluImpl(int64_t width, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear gate_proj{nullptr};
  torch::nn::Linear up_proj{nullptr};
  torch::nn::Linear down_proj{nullptr};
};
TORCH_MODULE(SwiGlu);

// Token embedding (+ dropout). Parameter "tok_embed.weight" [vocab, width].
class LlamaEmbeddingImpl : public LayerImpl {
 public:
  explicit LlamaEmbeddingImpl(const LlamaConfig& config);
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;

  torch::nn::Embedding tok_embed{nullptr};

 private:
  int64_t context_length_;
  torch::nn::Dropout dropout_{nullptr};
};

// Pre-norm decoder block. Not thread-safe.
class LlamaBlockImpl : public LayerImpl {
 public:
  explicit LlamaBlockImpl(const LlamaConfig& config);
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;

  RmsNorm input_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  RmsNorm post_attention_layernorm{nullptr};
  SwiGlu mlp{nullptr};

 private:
  torch::nn::Dropout dropout_{nullptr};
};

// Trainable parameters of one LlamaBlock, for the partitioners' declared counts.
int64_t LlamaBlockParameterCount(const LlamaConfig& config);

// The spec list above, num_layers + 3 specs, with declared parameter counts.
absl::StatusOr<std::vector<LayerSpec>> MakeLlamaSpecs(const LlamaConfig& config);

// Mean next-token cross-entropy of logits `outputs[0]` [b, T, V] against the
// micro-batch's "labels" [b, T] (the same loss as GptLoss).
torch::Tensor LlamaLoss(const Activations& outputs, const MicroBatch& batch);

}  // namespace pp

#endif  // MODELS_LLAMA_LLAMA_H_
