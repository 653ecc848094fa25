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
//
// Tensor parallelism (a factory's LayerContext::model_parallel of size tp):
// a rank holds num_heads / tp query heads and num_kv_heads / tp kv heads
// (q/k/v column-parallel, o row-parallel), intermediate_size / tp of the
// SwiGLU (gate/up column-parallel, down row-parallel), and its rows of the
// (padded) vocabulary in the embedding and the head, whose logits are this
// rank's columns (LlamaParallelLoss). Every shard is the slice of the dense
// layer the same seed draws, so weights do not depend on tp.
#ifndef MODELS_LLAMA_LLAMA_H_
#define MODELS_LLAMA_LLAMA_H_

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/llama/llama_config.pb.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_context.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/layers/vocab_split.h"
#include "pipeline/tensor_parallel/linear.h"
#include "pipeline/tensor_parallel/vocab_parallel.h"

namespace pp {

// InvalidArgument naming the bad field and value: sizes positive, width a
// multiple of num_heads with an even head width (rotary pairs), num_kv_heads
// dividing num_heads, rope_theta > 1, norm_eps > 0, dropout in [0, 1).
absl::Status ValidateLlamaModelConfig(const LlamaModelConfig& config);

// What tensor parallelism of size `tp` needs, naming the field: heads and
// the SwiGLU width split evenly, kv heads split evenly or divide tp; under
// sequence parallelism tp > 1 and context_length split evenly.
absl::Status ValidateLlamaParallelism(const LlamaModelConfig& config, int64_t tp,
                                      bool sequence_parallel);

// How many neighbouring tensor-parallel ranks hold each kv head: 1 when tp
// divides num_kv_heads, else tp / num_kv_heads (each rank holds the kv head
// of its query heads; the holders' gradients are summed). REQUIRES:
// ValidateLlamaParallelism(config, tp, ...) is OK.
int64_t LlamaKvReplicas(const LlamaModelConfig& config, int64_t tp);

// x * rsqrt(mean(x^2) + eps) * weight over the last dimension, computed in
// float32 and cast back (as Hugging Face's LlamaRMSNorm does). Parameter
// "weight" [width], initialised to ones.
// Under sequence parallelism (`group.sequence_parallel`) it normalises this
// rank's sequence slice and the weight's gradient is summed over the group.
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t width, double eps, const ModelParallelGroup& group = {});
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;

 private:
  double eps_;
  ModelParallelGroup group_;
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
// Packed sequences (models/packed_sequence.h): position_ids [b, T] rotate
// each token by its position within its document, document_ids [b, T] keep
// each query within its document (either may be undefined).
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaModelConfig& config, const ModelParallelGroup& group = {});
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& position_ids = {},
                        const torch::Tensor& document_ids = {});

  tensor_parallel::ColumnParallelLinear q_proj{nullptr};
  tensor_parallel::ColumnParallelLinear k_proj{nullptr};
  tensor_parallel::ColumnParallelLinear v_proj{nullptr};
  tensor_parallel::RowParallelLinear o_proj{nullptr};

 private:
  int64_t num_heads_;     // this rank's
  int64_t num_kv_heads_;  // this rank's
  int64_t head_dim_;
  double rope_theta_;
  ModelParallelGroup group_;
  torch::nn::Dropout attn_dropout_{nullptr};
};
TORCH_MODULE(LlamaAttention);

// down_proj(silu(gate_proj(x)) * up_proj(x)), no biases.
class SwiGluImpl : public torch::nn::Module {
 public:
  SwiGluImpl(int64_t width, int64_t hidden, const ModelParallelGroup& group = {});
  torch::Tensor forward(const torch::Tensor& x);

  tensor_parallel::ColumnParallelLinear gate_proj{nullptr};
  tensor_parallel::ColumnParallelLinear up_proj{nullptr};
  tensor_parallel::RowParallelLinear down_proj{nullptr};
};
TORCH_MODULE(SwiGlu);

// Token embedding (+ dropout). Parameter "tok_embed.weight" [vocab, width].
class LlamaEmbeddingImpl : public LayerImpl {
 public:
  explicit LlamaEmbeddingImpl(const LlamaModelConfig& config, const ModelParallelGroup& group = {});
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;
  // The tied LM head: this rank's logits of `x` through the token table.
  torch::Tensor Logits(const torch::Tensor& x) const;

  tensor_parallel::VocabParallelEmbedding tok_embed{nullptr};

 private:
  int64_t context_length_;
  ModelParallelGroup group_;
  torch::nn::Dropout dropout_{nullptr};
};

// Pre-norm decoder block. Not thread-safe.
class LlamaBlockImpl : public LayerImpl {
 public:
  explicit LlamaBlockImpl(const LlamaModelConfig& config, const ModelParallelGroup& group = {});
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;

  RmsNorm input_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  RmsNorm post_attention_layernorm{nullptr};
  SwiGlu mlp{nullptr};

 private:
  // The residual branches' dropout (this rank's sequence slice of the dense
  // mask under sequence parallelism).
  torch::Tensor Dropout(const torch::Tensor& y);

  torch::nn::Dropout dropout_{nullptr};
  ModelParallelGroup group_;
};

// Trainable parameters of one LlamaBlock, for the partitioners' declared counts.
int64_t LlamaBlockParameterCount(const LlamaModelConfig& config);

// The spec list above, num_layers + 3 specs, with declared parameter counts.
absl::StatusOr<std::vector<LayerSpec>> MakeLlamaSpecs(const LlamaModelConfig& config);

// LLaMA under vocabulary parallelism (pipeline/layers/vocab_split.h): the
// stages hold the embedding's dropout ("LlamaEmbeddingDropout", layer 0), the
// blocks and the final norm; the token table and the head (one table when
// tied, two when untied) are split by rows over the pipe group (pipe x model
// under tensor parallelism, with or without sequence parallelism).
absl::StatusOr<VocabularySplit> MakeLlamaVocabularySplit(const LlamaModelConfig& config);

// Mean next-token cross-entropy of logits `outputs[0]` [b, T, V] against the
// micro-batch's "labels" [b, T] (the same loss as GptLoss).
torch::Tensor LlamaLoss(const Activations& outputs, const MicroBatch& batch);

// The same loss from this rank's vocabulary columns of the logits (tensor
// parallelism; GptParallelLoss).
torch::Tensor LlamaParallelLoss(const Activations& outputs, const MicroBatch& batch,
                                int64_t vocab_size, const ModelParallelGroup& group);

}  // namespace pp

#endif  // MODELS_LLAMA_LLAMA_H_
