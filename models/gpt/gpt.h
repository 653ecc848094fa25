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
// Tensor parallelism comes from each factory's LayerContext: with a
// model-parallel group of size tp, a block holds num_heads / tp heads and
// 1/tp of the MLP (pipeline/tensor_parallel/linear.h), the token table holds
// 1/tp of the vocabulary's rows (padded to a multiple of tp), the tied head
// outputs this rank's logits [b, T, padded vocab / tp], and GptParallelLoss
// is the cross-entropy over those shards. Position embeddings and LayerNorms
// are replicated.
//
// Next: models/gpt/sample.h (text generation through the pipeline).
#ifndef MODELS_GPT_GPT_H_
#define MODELS_GPT_GPT_H_

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gpt/gpt_config.pb.h"
#include "models/transformer.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_context.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/layers/vocab_split.h"
#include "pipeline/tensor_parallel/vocab_parallel.h"

namespace pp {

// InvalidArgument naming the bad field: sizes must be positive, width a
// multiple of num_heads, dropout in [0, 1).
absl::Status ValidateGptModelConfig(const GptModelConfig& config);

// What tensor parallelism of size `tp` needs of `config`
// (ValidateTransformerParallelism).
absl::Status ValidateGptParallelism(const GptModelConfig& config, int64_t tp,
                                    bool sequence_parallel);

// Token + position embeddings (+ dropout). Parameters "tok_embed.weight"
// [vocab, width] (this rank's rows under tensor parallelism) and
// "pos_embed.weight" [context, width]. Not thread-safe.
class GptEmbeddingImpl : public LayerImpl {
 public:
  explicit GptEmbeddingImpl(const GptModelConfig& config, const ModelParallelGroup& group = {});
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;
  // The tied LM head: this rank's logits of hidden states `x` through the
  // token table (the input's gradient all-reduced over the group).
  torch::Tensor Logits(const torch::Tensor& x) const;

  tensor_parallel::VocabParallelEmbedding tok_embed{nullptr};
  torch::nn::Embedding pos_embed{nullptr};

 private:
  ModelParallelGroup group_;
  torch::nn::Dropout dropout_{nullptr};
};

// Vocabulary parallelism's first layer (MakeGptVocabularySplit): the token
// embeddings [b, T, width] (summed from every pipe rank's rows) plus the
// position embeddings, then dropout. Parameter "pos_embed.weight", drawn as
// GptEmbedding draws it. Dense, or whole on every tensor-parallel rank; under
// sequence parallelism the input is this rank's slice of the sequence and it
// adds its positions' rows. Not thread-safe.
class GptPositionEmbeddingImpl : public LayerImpl {
 public:
  explicit GptPositionEmbeddingImpl(const GptModelConfig& config,
                                    const ModelParallelGroup& group = {});
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;

  torch::nn::Embedding pos_embed{nullptr};

 private:
  ModelParallelGroup group_;
  torch::nn::Dropout dropout_{nullptr};
};

// x + attn(ln1(x)) with a causal mask, then x + mlp(ln2(x)). Not thread-safe.
class TransformerBlockImpl : public LayerImpl {
 public:
  explicit TransformerBlockImpl(const GptModelConfig& config, const ModelParallelGroup& group = {});
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;

 private:
  Fp32LayerNorm ln1_{nullptr};
  SelfAttention attn_{nullptr};
  Fp32LayerNorm ln2_{nullptr};
  Mlp mlp_{nullptr};
};

// The spec list above, num_layers + 3 specs, with declared (dense) parameter
// counts. Reused by benchmarks (activation checkpointing) that need a GPT.
// A factory given a model-parallel group of size tp builds its shard; one
// whose group config cannot split (ValidateGptParallelism) throws naming why.
absl::StatusOr<std::vector<LayerSpec>> MakeGptSpecs(const GptModelConfig& config);

// GPT under vocabulary parallelism (pipeline/layers/vocab_split.h): the
// stages hold GptPositionEmbedding, the blocks and the final norm (the last
// stage returns the normed hidden states); the token table, which is also the
// head, is split by rows over the pipe group (pipe x model under tensor
// parallelism, with or without sequence parallelism). Names map back to the dense
// model's ("layers.0.pos_embed.weight" is "tied.embed.pos_embed.weight").
absl::StatusOr<VocabularySplit> MakeGptVocabularySplit(const GptModelConfig& config);

// Mean next-token cross-entropy of logits `outputs[0]` [b, T, V] against the
// micro-batch's "labels" [b, T].
torch::Tensor GptLoss(const Activations& outputs, const MicroBatch& batch);

// The same loss from this rank's vocabulary shard of the logits
// [b, T, padded vocab / tp] (tensor_parallel::VocabParallelCrossEntropy: the
// full logits never exist on one rank). Equals GptLoss of the whole logits.
torch::Tensor GptParallelLoss(const Activations& outputs, const MicroBatch& batch,
                              int64_t vocab_size, const ModelParallelGroup& group);

}  // namespace pp

#endif  // MODELS_GPT_GPT_H_
