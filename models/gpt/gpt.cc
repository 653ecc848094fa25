#include "models/gpt/gpt.h"

#include <memory>

#include "absl/strings/str_cat.h"

namespace pp {

absl::Status ValidateGptConfig(const GptConfig& c) {
  return ValidateTransformerConfig("gpt",
                                   {{"vocab_size", c.vocab_size},
                                    {"context_length", c.context_length},
                                    {"width", c.width},
                                    {"num_heads", c.num_heads},
                                    {"num_layers", c.num_layers},
                                    {"mlp_ratio", c.mlp_ratio}},
                                   c.width, c.num_heads, c.dropout);
}

GptEmbeddingImpl::GptEmbeddingImpl(const GptConfig& config) : LayerImpl("GptEmbedding") {
  tok_embed = register_module("tok_embed", torch::nn::Embedding(config.vocab_size, config.width));
  pos_embed =
      register_module("pos_embed", torch::nn::Embedding(config.context_length, config.width));
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout));
  // GPT-2's initialisation: N(0, 0.02) rather than LibTorch's N(0, 1), which
  // would make the tied LM head's initial logits huge.
  torch::NoGradGuard no_grad;
  tok_embed->weight.normal_(0.0, 0.02);
  pos_embed->weight.normal_(0.0, 0.02);
}

Activations GptEmbeddingImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  const torch::Tensor ids = InputIds(inputs, batch);
  TORCH_CHECK(ids.dim() == 2, "GptEmbedding expects input_ids [batch, time], got ", ids.sizes());
  const int64_t time = ids.size(1);
  TORCH_CHECK(time <= pos_embed->weight.size(0), "sequence length ", time,
              " exceeds gpt.context_length ", pos_embed->weight.size(0));
  torch::Tensor positions =
      torch::arange(time, torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
  return {dropout_(tok_embed(ids) + pos_embed(positions))};
}

TransformerBlockImpl::TransformerBlockImpl(const GptConfig& config)
    : LayerImpl("TransformerBlock") {
  ln1_ = register_module("ln1", MakeLayerNorm(config.width));
  attn_ = register_module("attn", SelfAttention(config.width, config.num_heads, config.dropout));
  ln2_ = register_module("ln2", MakeLayerNorm(config.width));
  mlp_ = register_module("mlp", Mlp(config.width, config.mlp_ratio * config.width, config.dropout));
}

Activations TransformerBlockImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  TORCH_CHECK(inputs.size() == 1, "TransformerBlock expects one activation, got ", inputs.size());
  torch::Tensor x = inputs[0];
  x = x + attn_(ln1_(x), /*causal=*/true);
  x = x + mlp_(ln2_(x));
  return {x};
}

absl::StatusOr<std::vector<LayerSpec>> MakeGptSpecs(const GptConfig& config) {
  if (absl::Status s = ValidateGptConfig(config); !s.ok()) return s;
  const int64_t embed_params = (config.vocab_size + config.context_length) * config.width;
  LayerFactory embed = [config](const LayerContext&) {
    return std::make_shared<GptEmbeddingImpl>(config);
  };
  std::vector<LayerSpec> specs;
  specs.push_back(
      TiedLayerSpec("embed", embed).WithName("GptEmbedding").WithParameterCount(embed_params));
  for (int64_t i = 0; i < config.num_layers; ++i) {
    specs.push_back(LayerSpec("TransformerBlock",
                              [config](const LayerContext&) {
                                return std::make_shared<TransformerBlockImpl>(config);
                              })
                        .WithParameterCount(TransformerBlockParameterCount(
                            config.width, config.mlp_ratio * config.width)));
  }
  specs.push_back(LayerSpec("FinalLayerNorm", [width = config.width](const LayerContext&) {
                    return MakeModuleLayer(MakeLayerNorm(width), "FinalLayerNorm");
                  }).WithParameterCount(2 * config.width));
  // The head reuses the embedding table: count its matmul like the table.
  specs.push_back(TiedLayerSpec("embed", embed, TiedProjection("tok_embed.weight"))
                      .WithName("LmHead")
                      .WithParameterCount(config.vocab_size * config.width));
  return specs;
}

torch::Tensor GptLoss(const Activations& outputs, const MicroBatch& batch) {
  TORCH_CHECK(outputs.size() == 1, "GptLoss expects one output (logits), got ", outputs.size());
  const torch::Tensor& logits = outputs[0];
  const torch::Tensor& labels = batch.Get("labels");
  TORCH_CHECK(logits.dim() == 3 && labels.sizes() == logits.sizes().slice(0, 2), "GptLoss: logits ",
              logits.sizes(), " do not match labels ", labels.sizes());
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(2)}),
                                              labels.reshape({-1}));
}

}  // namespace pp
