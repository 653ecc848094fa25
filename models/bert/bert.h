// The reference BERT (masked language model) as a pipeline spec list
// (models/README.md).
//
//   TiedLayerSpec("embed")  word + position + token-type embeddings, LayerNorm
//   N x EncoderBlock        post-LayerNorm, bidirectional attention that reads
//                           the micro-batch's "attention_mask" (padding)
//   MlmTransform            dense + GELU + LayerNorm
//   TiedLayerSpec("embed")  "MlmDecoder": x @ word_embedding^T
//   MlmBias                 the decoder's own output bias
//
// Inputs come from models/data/mlm_data.h; BertMlmLoss is cross-entropy over
// the masked positions only. `type:EncoderBlock` partitions on block boundaries.
//
// Tensor parallelism (a LayerContext's model_parallel group of size tp > 1):
// each rank holds num_heads / tp heads and its share of every MLP
// (SelfAttention, Mlp), its rows of the padded vocabulary in the word
// embedding, the tied decoder's logits and the MLM bias; the rest is whole on
// every rank. BertParallelLoss computes the loss from the logits' shards.
// Sequence parallelism is not supported (ValidateBertParallelism).
#ifndef MODELS_BERT_BERT_H_
#define MODELS_BERT_BERT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/bert/bert_config.pb.h"
#include "models/transformer.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/tensor_parallel/sharded_module.h"
#include "pipeline/tensor_parallel/vocab_parallel.h"

namespace pp {

// Token types: segment A (0) and segment B (1) of a masked-LM sample
// (models/data/mlm_data.h), as in BERT.
inline constexpr int64_t kBertTypeVocabSize = 2;

// InvalidArgument naming the bad field.
absl::Status ValidateBertModelConfig(const BertModelConfig& config);

// What tensor parallelism of size `tp` needs of `config`: heads and the MLP's
// hidden width divisible by tp, and under sequence parallelism the context
// length (ValidateTransformerParallelism). InvalidArgument naming the field.
absl::Status ValidateBertParallelism(const BertModelConfig& config, int64_t tp,
                                     bool sequence_parallel);

// Parameters "word_embed.weight", "pos_embed.weight", "type_embed.weight",
// "norm.{weight,bias}" ("word_embed.weight": this rank's rows of the padded
// vocabulary under tensor parallelism). Token types default to 0 when the
// micro-batch has no "token_type_ids". Not thread-safe.
class BertEmbeddingImpl : public LayerImpl {
 public:
  explicit BertEmbeddingImpl(const BertModelConfig& config, const ModelParallelGroup& group = {});
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;
  // The tied MLM decoder: this rank's logits of hidden states `x` through the
  // word table (the input's gradient all-reduced over the group).
  torch::Tensor Logits(const torch::Tensor& x) const;

  tensor_parallel::VocabParallelEmbedding word_embed{nullptr};
  torch::nn::Embedding pos_embed{nullptr};
  torch::nn::Embedding type_embed{nullptr};

 private:
  Fp32LayerNorm norm_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  ModelParallelGroup group_;
};

// x = ln1(x + attn(x, key_mask)); x = ln2(x + mlp(x)). The key mask is the
// micro-batch's "attention_mask" [b, T] (true = real token), when present.
class EncoderBlockImpl : public LayerImpl {
 public:
  explicit EncoderBlockImpl(const BertModelConfig& config, const ModelParallelGroup& group = {});
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;

 private:
  SelfAttention attn_{nullptr};
  Fp32LayerNorm ln1_{nullptr};
  Mlp mlp_{nullptr};
  Fp32LayerNorm ln2_{nullptr};
};

// The MLM head's transform: LayerNorm(GELU(dense(x))), replicated on every
// tensor-parallel rank (on its slice of the sequence under sequence
// parallelism).
class MlmTransformImpl : public LayerImpl {
 public:
  explicit MlmTransformImpl(const BertModelConfig& config, const ModelParallelGroup& group = {});
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;

 private:
  torch::nn::Linear dense_{nullptr};
  Fp32LayerNorm norm_{nullptr};
  ModelParallelGroup group_;
};

// logits + bias, bias [vocab] initialised to zero (this rank's slice of the
// padded vocabulary under tensor parallelism).
class MlmBiasImpl : public LayerImpl, public tensor_parallel::ShardedModule {
 public:
  explicit MlmBiasImpl(int64_t vocab_size, const ModelParallelGroup& group = {});
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;
  std::map<std::string, tensor_parallel::ShardSpec> ShardDims() const override;

  torch::Tensor bias;

 private:
  bool parallel_;
};

// num_layers + 4 specs with declared parameter counts.
absl::StatusOr<std::vector<LayerSpec>> MakeBertSpecs(const BertModelConfig& config);

// Mean cross-entropy of logits `outputs[0]` [b, T, V] over the positions whose
// "labels" are not kIgnoreLabel (-100).
torch::Tensor BertMlmLoss(const Activations& outputs, const MicroBatch& batch);

// The same loss from this rank's vocabulary shard of the logits
// [b, T, padded vocab / tp] (tensor_parallel::VocabParallelCrossEntropy: the
// full logits never exist on one rank).
torch::Tensor BertParallelLoss(const Activations& outputs, const MicroBatch& batch,
                               int64_t vocab_size, const ModelParallelGroup& group);

}  // namespace pp

#endif  // MODELS_BERT_BERT_H_
