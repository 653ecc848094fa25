#include "models/llama/llama.h"

#include <cmath>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/field_checks.h"
#include "models/gpt/gpt.h"
#include "models/transformer.h"

namespace pp {
namespace {

absl::Status Invalid(absl::string_view field, double value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat("llama.", field, " (", value, ") ", rule));
}

// Hugging Face's LlamaPreTrainedModel initialisation (initializer_range 0.02)
// rather than LibTorch's defaults: N(0, 1) embeddings would make the tied
// head's first logits huge.
void InitNormal(torch::Tensor& weight) {
  torch::NoGradGuard no_grad;
  weight.normal_(0.0, 0.02);
}

torch::nn::Linear NoBiasLinear(int64_t in, int64_t out) {
  torch::nn::Linear linear(torch::nn::LinearOptions(in, out).bias(false));
  InitNormal(linear->weight);
  return linear;
}

}  // namespace

absl::Status ValidateLlamaConfig(const LlamaConfig& c) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                                    {"context_length", c.context_length},
                                    {"width", c.width},
                                    {"num_heads", c.num_heads},
                                    {"num_kv_heads", c.num_kv_heads},
                                    {"num_layers", c.num_layers},
                                    {"intermediate_size", c.intermediate_size}}) {
    if (value <= 0) return Invalid(name, value, "must be positive");
  }
  if (c.width % c.num_heads != 0) {
    return Invalid("width", c.width,
                   absl::StrCat("must be a multiple of llama.num_heads (", c.num_heads, ")"));
  }
  if ((c.width / c.num_heads) % 2 != 0) {
    return Invalid("width", c.width,
                   absl::StrCat("/ llama.num_heads (", c.num_heads,
                                ") must be even: rotary embeddings rotate pairs of dimensions"));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return Invalid("num_kv_heads", c.num_kv_heads,
                   absl::StrCat("must divide llama.num_heads (", c.num_heads, ")"));
  }
  // Finite and bounded (issue #42, class 5): norm_eps = 1e300 or inf trained
  // at a constant loss of ln(vocab), the norm swamping every activation.
  if (absl::Status s = CheckRealField("llama.rope_theta", c.rope_theta, '(', 1, 1e12, ']',
                                      "the base of the rotary frequencies");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRealField("llama.norm_eps", c.norm_eps, '(', 0, 1, ']',
                                      "a larger epsilon swamps the activations it normalises");
      !s.ok()) {
    return s;
  }
  return CheckRealField("llama.dropout", c.dropout, '[', 0, 1, ')');
}

RmsNormImpl::RmsNormImpl(int64_t width, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({width}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  torch::Tensor x32 = x.to(torch::kFloat);
  torch::Tensor normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * normed.to(x.scalar_type());
}

std::pair<torch::Tensor, torch::Tensor> RotaryTables(int64_t time, int64_t head_dim, double theta,
                                                     const torch::Device& device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  // As Hugging Face computes them (float32 throughout), so exported models
  // match transformers' logits to rounding.
  torch::Tensor inv_freq =
      1.0 / torch::pow(theta, torch::arange(0, head_dim, 2, torch::kLong).to(f32) / head_dim);
  torch::Tensor freqs = torch::outer(torch::arange(time, f32), inv_freq);
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

torch::Tensor ApplyRotary(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor rotated = torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos.to(x.scalar_type()) + rotated * sin.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& config)
    : num_heads_(config.num_heads),
      num_kv_heads_(config.num_kv_heads),
      head_dim_(config.width / config.num_heads),
      rope_theta_(config.rope_theta) {
  TORCH_CHECK(ValidateLlamaConfig(config).ok(), ValidateLlamaConfig(config).ToString());
  q_proj = register_module("q_proj", NoBiasLinear(config.width, num_heads_ * head_dim_));
  k_proj = register_module("k_proj", NoBiasLinear(config.width, num_kv_heads_ * head_dim_));
  v_proj = register_module("v_proj", NoBiasLinear(config.width, num_kv_heads_ * head_dim_));
  o_proj = register_module("o_proj", NoBiasLinear(num_heads_ * head_dim_, config.width));
  attn_dropout_ = register_module("attn_dropout", torch::nn::Dropout(config.dropout));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 3, "attention expects [batch, time, width], got ", x.sizes());
  const int64_t batch = x.size(0);
  const int64_t time = x.size(1);
  // [b, T, heads * d] -> [b, heads, T, d]
  torch::Tensor q = q_proj(x).view({batch, time, num_heads_, head_dim_}).transpose(1, 2);
  torch::Tensor k = k_proj(x).view({batch, time, num_kv_heads_, head_dim_}).transpose(1, 2);
  torch::Tensor v = v_proj(x).view({batch, time, num_kv_heads_, head_dim_}).transpose(1, 2);
  auto [cos, sin] = RotaryTables(time, head_dim_, rope_theta_, x.device());
  q = ApplyRotary(q, cos, sin);
  k = ApplyRotary(k, cos, sin);
  if (num_kv_heads_ != num_heads_) {
    // Each kv head serves heads / kv_heads consecutive query heads.
    const int64_t group = num_heads_ / num_kv_heads_;
    k = k.unsqueeze(2)
            .expand({batch, num_kv_heads_, group, time, head_dim_})
            .reshape({batch, num_heads_, time, head_dim_});
    v = v.unsqueeze(2)
            .expand({batch, num_kv_heads_, group, time, head_dim_})
            .reshape({batch, num_heads_, time, head_dim_});
  }
  torch::Tensor scores =
      torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
  torch::Tensor future =
      torch::ones({time, time}, torch::TensorOptions().dtype(torch::kBool).device(x.device()))
          .triu(/*diagonal=*/1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  torch::Tensor weights = attn_dropout_(torch::softmax(scores, -1, torch::kFloat).to(q.dtype()));
  torch::Tensor out =
      torch::matmul(weights, v).transpose(1, 2).reshape({batch, time, num_heads_ * head_dim_});
  return o_proj(out);
}

SwiGluImpl::SwiGluImpl(int64_t width, int64_t hidden) {
  gate_proj = register_module("gate_proj", NoBiasLinear(width, hidden));
  up_proj = register_module("up_proj", NoBiasLinear(width, hidden));
  down_proj = register_module("down_proj", NoBiasLinear(hidden, width));
}

torch::Tensor SwiGluImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

LlamaEmbeddingImpl::LlamaEmbeddingImpl(const LlamaConfig& config)
    : LayerImpl("LlamaEmbedding"), context_length_(config.context_length) {
  tok_embed = register_module("tok_embed", torch::nn::Embedding(config.vocab_size, config.width));
  InitNormal(tok_embed->weight);
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout));
}

Activations LlamaEmbeddingImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  const torch::Tensor ids = InputIds(inputs, batch);
  TORCH_CHECK(ids.dim() == 2, "LlamaEmbedding expects input_ids [batch, time], got ", ids.sizes());
  TORCH_CHECK(ids.size(1) <= context_length_, "sequence length ", ids.size(1),
              " exceeds llama.context_length ", context_length_);
  return {dropout_(tok_embed(ids))};
}

LlamaBlockImpl::LlamaBlockImpl(const LlamaConfig& config) : LayerImpl("LlamaBlock") {
  input_layernorm = register_module("input_layernorm", RmsNorm(config.width, config.norm_eps));
  self_attn = register_module("self_attn", LlamaAttention(config));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(config.width, config.norm_eps));
  mlp = register_module("mlp", SwiGlu(config.width, config.intermediate_size));
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout));
}

Activations LlamaBlockImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  TORCH_CHECK(inputs.size() == 1, "LlamaBlock expects one activation, got ", inputs.size());
  torch::Tensor x = inputs[0];
  x = x + dropout_(self_attn(input_layernorm(x)));
  x = x + dropout_(mlp(post_attention_layernorm(x)));
  return {x};
}

int64_t LlamaBlockParameterCount(const LlamaConfig& c) {
  const int64_t head_dim = c.width / c.num_heads;
  const int64_t attention = c.width * c.num_heads * head_dim * 2 +    // q, o
                            c.width * c.num_kv_heads * head_dim * 2;  // k, v
  const int64_t mlp = 3 * c.width * c.intermediate_size;
  return attention + mlp + 2 * c.width;
}

absl::StatusOr<std::vector<LayerSpec>> MakeLlamaSpecs(const LlamaConfig& config) {
  if (absl::Status s = ValidateLlamaConfig(config); !s.ok()) return s;
  const int64_t table = config.vocab_size * config.width;
  LayerFactory embed = [config](const LayerContext&) {
    return std::make_shared<LlamaEmbeddingImpl>(config);
  };
  std::vector<LayerSpec> specs;
  if (config.tie_embeddings) {
    specs.push_back(
        TiedLayerSpec("embed", embed).WithName("LlamaEmbedding").WithParameterCount(table));
  } else {
    specs.push_back(LayerSpec("LlamaEmbedding", embed).WithParameterCount(table));
  }
  for (int64_t i = 0; i < config.num_layers; ++i) {
    specs.push_back(LayerSpec("LlamaBlock", [config](const LayerContext&) {
                      return std::make_shared<LlamaBlockImpl>(config);
                    }).WithParameterCount(LlamaBlockParameterCount(config)));
  }
  specs.push_back(LayerSpec("FinalRmsNorm", [config](const LayerContext&) {
                    return MakeModuleLayer(RmsNorm(config.width, config.norm_eps), "FinalRmsNorm");
                  }).WithParameterCount(config.width));
  if (config.tie_embeddings) {
    // The head reuses the embedding table: count its matmul like the table.
    specs.push_back(TiedLayerSpec("embed", embed, TiedProjection("tok_embed.weight"))
                        .WithName("LmHead")
                        .WithParameterCount(table));
  } else {
    specs.push_back(LayerSpec("LmHead", [config](const LayerContext&) {
                      return MakeModuleLayer(NoBiasLinear(config.width, config.vocab_size),
                                             "LmHead");
                    }).WithParameterCount(table));
  }
  return specs;
}

torch::Tensor LlamaLoss(const Activations& outputs, const MicroBatch& batch) {
  return GptLoss(outputs, batch);
}

}  // namespace pp
