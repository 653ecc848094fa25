#include "models/bert/bert.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pp {
namespace {

Fp32LayerNorm Norm(int64_t width) { return MakeLayerNorm(width); }

}  // namespace

absl::Status ValidateBertConfig(const BertConfig& c) {
  return ValidateTransformerConfig("bert",
                                   {{"vocab_size", c.vocab_size},
                                    {"context_length", c.context_length},
                                    {"width", c.width},
                                    {"num_heads", c.num_heads},
                                    {"num_layers", c.num_layers},
                                    {"mlp_ratio", c.mlp_ratio},
                                    {"type_vocab_size", c.type_vocab_size}},
                                   c.width, c.num_heads, c.dropout);
}

BertEmbeddingImpl::BertEmbeddingImpl(const BertConfig& config) : LayerImpl("BertEmbedding") {
  word_embed = register_module("word_embed", torch::nn::Embedding(config.vocab_size, config.width));
  pos_embed =
      register_module("pos_embed", torch::nn::Embedding(config.context_length, config.width));
  type_embed =
      register_module("type_embed", torch::nn::Embedding(config.type_vocab_size, config.width));
  norm_ = register_module("norm", Norm(config.width));
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout));
  // BERT's N(0, 0.02) initialisation (the word table is also the decoder).
  torch::NoGradGuard no_grad;
  for (torch::nn::Embedding* e : {&word_embed, &pos_embed, &type_embed})
    (*e)->weight.normal_(0.0, 0.02);
}

Activations BertEmbeddingImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  const torch::Tensor ids = InputIds(inputs, batch);
  TORCH_CHECK(ids.dim() == 2, "BertEmbedding expects input_ids [batch, time], got ", ids.sizes());
  const int64_t time = ids.size(1);
  TORCH_CHECK(time <= pos_embed->weight.size(0), "sequence length ", time,
              " exceeds bert.context_length ", pos_embed->weight.size(0));
  torch::Tensor positions =
      torch::arange(time, torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
  torch::Tensor types =
      batch.Has("token_type_ids") ? batch.Get("token_type_ids") : torch::zeros_like(ids);
  return {dropout_(norm_(word_embed(ids) + pos_embed(positions) + type_embed(types)))};
}

EncoderBlockImpl::EncoderBlockImpl(const BertConfig& config) : LayerImpl("EncoderBlock") {
  attn_ = register_module("attn", SelfAttention(config.width, config.num_heads, config.dropout));
  ln1_ = register_module("ln1", Norm(config.width));
  mlp_ = register_module("mlp", Mlp(config.width, config.mlp_ratio * config.width, config.dropout));
  ln2_ = register_module("ln2", Norm(config.width));
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

MlmTransformImpl::MlmTransformImpl(const BertConfig& config) : LayerImpl("MlmTransform") {
  dense_ = register_module("dense", torch::nn::Linear(config.width, config.width));
  norm_ = register_module("norm", Norm(config.width));
}

Activations MlmTransformImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  TORCH_CHECK(inputs.size() == 1, "MlmTransform expects one activation, got ", inputs.size());
  return {norm_(torch::gelu(dense_(inputs[0])))};
}

MlmBiasImpl::MlmBiasImpl(int64_t vocab_size) : LayerImpl("MlmBias") {
  bias = register_parameter("bias", torch::zeros({vocab_size}));
}

Activations MlmBiasImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  TORCH_CHECK(inputs.size() == 1, "MlmBias expects one activation, got ", inputs.size());
  return {inputs[0] + bias};
}

absl::StatusOr<std::vector<LayerSpec>> MakeBertSpecs(const BertConfig& config) {
  if (absl::Status s = ValidateBertConfig(config); !s.ok()) return s;
  const int64_t w = config.width;
  const int64_t embed_params =
      (config.vocab_size + config.context_length + config.type_vocab_size) * w + 2 * w;
  LayerFactory embed = [config](const LayerContext&) {
    return std::make_shared<BertEmbeddingImpl>(config);
  };
  std::vector<LayerSpec> specs;
  specs.push_back(
      TiedLayerSpec("embed", embed).WithName("BertEmbedding").WithParameterCount(embed_params));
  for (int64_t i = 0; i < config.num_layers; ++i) {
    specs.push_back(LayerSpec("EncoderBlock", [config](const LayerContext&) {
                      return std::make_shared<EncoderBlockImpl>(config);
                    }).WithParameterCount(TransformerBlockParameterCount(w, config.mlp_ratio * w)));
  }
  specs.push_back(LayerSpec("MlmTransform", [config](const LayerContext&) {
                    return std::make_shared<MlmTransformImpl>(config);
                  }).WithParameterCount(w * w + w + 2 * w));
  specs.push_back(TiedLayerSpec("embed", embed, TiedProjection("word_embed.weight"))
                      .WithName("MlmDecoder")
                      .WithParameterCount(config.vocab_size * w));
  specs.push_back(LayerSpec("MlmBias", [v = config.vocab_size](const LayerContext&) {
                    return std::make_shared<MlmBiasImpl>(v);
                  }).WithParameterCount(config.vocab_size));
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

}  // namespace pp
