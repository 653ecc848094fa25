// The reference GPT as a pipeline spec list (models/README.md).
//
//   TiedLayerSpec("embed")  token + learned position embeddings
//   N x TransformerBlock    pre-LayerNorm, causal multi-head attention, GELU MLP
//   FinalLayerNorm
//   TiedLayerSpec("embed")  "LmHead": logits = x @ token_embedding^T
//
// The first stage reads the micro-batch's "input_ids" [b, T]; the last stage
// outputs logits [b, T, vocab]; GptLoss compares them with "labels".
// `type:TransformerBlock` partitions on block boundaries.
//
// Next: models/gpt/sample.h (text generation through the pipeline).
#ifndef MODELS_GPT_GPT_H_
#define MODELS_GPT_GPT_H_

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/transformer.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_spec.h"

namespace pp {

struct GptConfig {
  int64_t vocab_size = 260;  // ByteTokenizer::kVocabSize
  int64_t context_length = 128;
  int64_t width = 128;
  int64_t num_heads = 4;
  int64_t num_layers = 4;
  int64_t mlp_ratio = 4;
  double dropout = 0.0;
};

// InvalidArgument naming the bad field: sizes must be positive, width a
// multiple of num_heads, dropout in [0, 1).
absl::Status ValidateGptConfig(const GptConfig& config);

// Token + position embeddings (+ dropout). Parameters "tok_embed.weight"
// [vocab, width] and "pos_embed.weight" [context, width]. Not thread-safe.
class GptEmbeddingImpl : public LayerImpl {
 public:
  explicit GptEmbeddingImpl(const GptConfig& config);
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;

  torch::nn::Embedding tok_embed{nullptr};
  torch::nn::Embedding pos_embed{nullptr};

 private:
  torch::nn::Dropout dropout_{nullptr};
};

// x + attn(ln1(x)) with a causal mask, then x + mlp(ln2(x)). Not thread-safe.
class TransformerBlockImpl : public LayerImpl {
 public:
  explicit TransformerBlockImpl(const GptConfig& config);
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;

 private:
  Fp32LayerNorm ln1_{nullptr};
  SelfAttention attn_{nullptr};
  Fp32LayerNorm ln2_{nullptr};
  Mlp mlp_{nullptr};
};

// The spec list above, num_layers + 3 specs, with declared parameter counts.
// Reused by benchmarks (activation checkpointing) that need a GPT.
absl::StatusOr<std::vector<LayerSpec>> MakeGptSpecs(const GptConfig& config);

// Mean next-token cross-entropy of logits `outputs[0]` [b, T, V] against the
// micro-batch's "labels" [b, T].
torch::Tensor GptLoss(const Activations& outputs, const MicroBatch& batch);

}  // namespace pp

#endif  // MODELS_GPT_GPT_H_
