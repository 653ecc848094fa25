#include "models/bert/bert.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pipeline/tensor_parallel/dropout.h"
#include "pipeline/tensor_parallel/linear.h"

namespace pp {

absl::Status ValidateBertModelConfig(const BertModelConfig& config) {
  return ValidateTransformerConfig("bert", config);
}

absl::Status ValidateBertParallelism(const BertModelConfig& config, int64_t tp,
                                     bool sequence_parallel) {
  return ValidateTransformerParallelism("bert", config, tp, sequence_parallel);
}

BertEmbeddingImpl::BertEmbeddingImpl(const BertModelConfig& config, const ModelParallelGroup& group)
    : LayerImpl("BertEmbedding"), group_(group) {
  CheckTransformerParallelism("bert", config, group);
  // The dense word table drawn as the dense model draws it, so that a
  // tensor-parallel rank's rows are its slice (the same draws in the same
  // order at every tp); the modules registered in the dense order, which the
  // gradient norm's sum follows.
  torch::nn::Embedding table(config.vocab_size(), config.width());
  torch::nn::Embedding pos(config.context_length(), config.width());
  torch::nn::Embedding types(kBertTypeVocabSize, config.width());
  {
    // BERT's N(0, 0.02) initialisation (the word table is also the decoder).
    torch::NoGradGuard no_grad;
    for (torch::nn::Embedding* e : {&table, &pos, &types}) (*e)->weight.normal_(0.0, 0.02);
  }
  word_embed =
      register_module("word_embed", tensor_parallel::VocabParallelEmbedding(table->weight, group));
  pos_embed = register_module("pos_embed", pos);
  type_embed = register_module("type_embed", types);
  norm_ = register_module("norm", MakeLayerNorm(config.width(), group));
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout()));
}

torch::Tensor BertEmbeddingImpl::Logits(const torch::Tensor& x) const {
  return tensor_parallel::VocabParallelLogits(x, word_embed->weight, group_);
}

Activations BertEmbeddingImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  const torch::Tensor ids =
      EmbeddingInputIds(inputs, batch, "BertEmbedding", "bert", pos_embed->weight.size(0));
  const int64_t time = ids.size(1);
  torch::Tensor positions =
      torch::arange(time, torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
  torch::Tensor types =
      batch.Has("token_type_ids") ? batch.Get("token_type_ids") : torch::zeros_like(ids);
  if (!group_.sequence_parallel) {
    return {dropout_(norm_(word_embed(ids) + pos_embed(positions) + type_embed(types)))};
  }
  // Sequence parallelism: the word embeddings arrive reduce-scattered to this
  // rank's slice of the sequence; that slice's rows of the (replicated)
  // position and type tables, whose gradients the group sums; the dense
  // model's dropout noise, sliced.
  const auto [begin, local] = SequenceSlice(time, group_);
  const torch::Tensor x =
      word_embed(ids) +
      torch::embedding(tensor_parallel::SequenceParallelReplicated(pos_embed->weight, group_),
                       positions.narrow(0, begin, local)) +
      torch::embedding(tensor_parallel::SequenceParallelReplicated(type_embed->weight, group_),
                       types.narrow(1, begin, local));
  return {
      tensor_parallel::ShardedDropout(norm_(x), dropout_->options.p(), is_training(), 1, group_)};
}

EncoderBlockImpl::EncoderBlockImpl(const BertModelConfig& config, const ModelParallelGroup& group)
    : LayerImpl("EncoderBlock") {
  CheckTransformerParallelism("bert", config, group);
  attn_ = register_module(
      "attn", SelfAttention(config.width(), config.num_heads(), config.dropout(), group));
  ln1_ = register_module("ln1", MakeLayerNorm(config.width(), group));
  mlp_ = register_module(
      "mlp", Mlp(config.width(), config.mlp_ratio() * config.width(), config.dropout(), group));
  ln2_ = register_module("ln2", MakeLayerNorm(config.width(), group));
}

Activations EncoderBlockImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  TORCH_CHECK(inputs.size() == 1, "EncoderBlock expects one activation, got ", inputs.size());
  const torch::Tensor key_mask =
      batch.Has("attention_mask") ? batch.Get("attention_mask") : torch::Tensor();
  torch::Tensor x = inputs[0];
  x = ln1_(x + attn_(x, /*causal=*/false, key_mask));
  x = ln2_(x + mlp_(x));
  return {x};
}

MlmTransformImpl::MlmTransformImpl(const BertModelConfig& config, const ModelParallelGroup& group)
    : LayerImpl("MlmTransform"), group_(group) {
  dense_ = register_module("dense", torch::nn::Linear(config.width(), config.width()));
  norm_ = register_module("norm", MakeLayerNorm(config.width(), group));
}

Activations MlmTransformImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  TORCH_CHECK(inputs.size() == 1, "MlmTransform expects one activation, got ", inputs.size());
  // Replicated on every tensor-parallel rank; under sequence parallelism each
  // rank transforms its slice of the sequence and the group sums the
  // weights' gradients.
  const torch::Tensor y = torch::nn::functional::linear(
      inputs[0], tensor_parallel::SequenceParallelReplicated(dense_->weight, group_),
      tensor_parallel::SequenceParallelReplicated(dense_->bias, group_));
  return {norm_(torch::gelu(y))};
}

MlmBiasImpl::MlmBiasImpl(int64_t vocab_size, const ModelParallelGroup& group)
    : LayerImpl("MlmBias"), parallel_(group.is_parallel()) {
  const tensor_parallel::VocabRange range = tensor_parallel::LocalVocabRange(vocab_size, group);
  bias = register_parameter("bias", torch::zeros({range.end - range.begin}));
}

std::map<std::string, tensor_parallel::ShardSpec> MlmBiasImpl::ShardDims() const {
  if (!parallel_) return {};
  return {{"bias", tensor_parallel::ShardSpec{0, 1}}};
}

Activations MlmBiasImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  TORCH_CHECK(inputs.size() == 1, "MlmBias expects one activation, got ", inputs.size());
  return {inputs[0] + bias};
}

absl::StatusOr<std::vector<LayerSpec>> MakeBertSpecs(const BertModelConfig& config) {
  if (absl::Status s = ValidateBertModelConfig(config); !s.ok()) return s;
  const int64_t w = config.width();
  const int64_t embed_params =
      (config.vocab_size() + config.context_length() + kBertTypeVocabSize) * w + 2 * w;
  LayerFactory embed = [config](const LayerContext& ctx) {
    return std::make_shared<BertEmbeddingImpl>(config, ctx.model_parallel);
  };
  std::vector<LayerSpec> specs;
  specs.push_back(
      TiedLayerSpec("embed", embed).WithName("BertEmbedding").WithParameterCount(embed_params));
  for (int64_t i = 0; i < config.num_layers(); ++i) {
    specs.push_back(
        LayerSpec("EncoderBlock", [config](const LayerContext& ctx) {
          return std::make_shared<EncoderBlockImpl>(config, ctx.model_parallel);
        }).WithParameterCount(TransformerBlockParameterCount(w, config.mlp_ratio() * w)));
  }
  specs.push_back(LayerSpec("MlmTransform", [config](const LayerContext& ctx) {
                    return std::make_shared<MlmTransformImpl>(config, ctx.model_parallel);
                  }).WithParameterCount(w * w + w + 2 * w));
  // x @ word_embedding^T through the embedding's Logits: under tensor
  // parallelism this rank's vocabulary columns, the input's gradient summed
  // over the group.
  TiedForwardFn decoder = [](LayerImpl& shared, const Activations& inputs, const MicroBatch&) {
    const auto& embedding = dynamic_cast<const BertEmbeddingImpl&>(shared);
    Activations out;
    for (const torch::Tensor& x : inputs) out.push_back(embedding.Logits(x));
    return out;
  };
  specs.push_back(TiedLayerSpec("embed", embed, decoder)
                      .WithName("MlmDecoder")
                      .WithParameterCount(config.vocab_size() * w));
  specs.push_back(LayerSpec("MlmBias", [v = config.vocab_size()](const LayerContext& ctx) {
                    return std::make_shared<MlmBiasImpl>(v, ctx.model_parallel);
                  }).WithParameterCount(config.vocab_size()));
  return specs;
}

torch::Tensor BertMlmLoss(const Activations& outputs, const MicroBatch& batch) {
  TORCH_CHECK(outputs.size() == 1, "BertMlmLoss expects one output (logits), got ", outputs.size());
  const torch::Tensor& logits = outputs[0];
  const torch::Tensor& labels = batch.Get("labels");
  TORCH_CHECK(logits.dim() == 3 && labels.sizes() == logits.sizes().slice(0, 2),
              "BertMlmLoss: logits ", logits.sizes(), " do not match labels ", labels.sizes());
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(2)}), labels.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
}

torch::Tensor BertParallelLoss(const Activations& outputs, const MicroBatch& batch,
                               int64_t vocab_size, const ModelParallelGroup& group) {
  TORCH_CHECK(outputs.size() == 1, "BertParallelLoss expects one output (logits), got ",
              outputs.size());
  const torch::Tensor& logits = outputs[0];
  const torch::Tensor& labels = batch.Get("labels");
  TORCH_CHECK(logits.dim() == 3 && labels.sizes() == logits.sizes().slice(0, 2),
              "BertParallelLoss: logits ", logits.sizes(), " do not match labels ", labels.sizes());
  // Per token, 0 where the label is ignored; the mean over the masked
  // positions as cross_entropy's (NaN when there are none, as there).
  const torch::Tensor per_token = tensor_parallel::VocabParallelCrossEntropy(
      logits, labels, vocab_size, group, /*ignore_index=*/-100);
  return per_token.sum() / labels.ne(-100).sum().to(per_token.scalar_type());
}

}  // namespace pp
