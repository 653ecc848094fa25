#include "models/llama/llama.h"

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/field_checks.h"
#include "common/status_macros.h"
#include "common/torch_compat_attention.h"
#include "models/gpt/gpt.h"
#include "models/packed_sequence.h"
#include "models/transformer.h"
#include "pipeline/tensor_parallel/dropout.h"

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

// NoBiasLinear's weights, this rank's slice: the parallel layer draws the
// dense Linear as NoBiasLinear's constructor does, then the dense N(0, 0.02)
// weight is drawn whole and the layer keeps its slice of it.
template <typename ParallelLinear>
ParallelLinear NoBiasParallelLinear(int64_t in, int64_t out, const ModelParallelGroup& group,
                                    int64_t replicas = 1) {
  ParallelLinear linear(
      tensor_parallel::ParallelLinearOptions(in, out).Bias(false).Replicas(replicas), group);
  torch::NoGradGuard no_grad;
  torch::Tensor full = torch::empty({out, in});
  InitNormal(full);
  const auto dims = linear->ShardDims();
  const auto it = dims.find("weight");
  linear->weight.copy_(
      it == dims.end() ? full : tensor_parallel::ShardOf(full, it->second, group.rank, group.size));
  return linear;
}

// The untied head under tensor parallelism: this rank's rows of the dense
// head's (padded) vocabulary, its logits' columns.
class VocabParallelHeadImpl : public LayerImpl, public tensor_parallel::ShardedModule {
 public:
  VocabParallelHeadImpl(int64_t width, int64_t vocab, const ModelParallelGroup& group)
      : LayerImpl("LmHead"), group_(group) {
    torch::nn::Linear dense = NoBiasLinear(width, vocab);  // the dense head's draws
    weight = register_parameter("weight", tensor_parallel::LocalVocabRows(dense->weight, group));
  }
  Activations Forward(const Activations& inputs, const MicroBatch&) override {
    Activations out;
    for (const torch::Tensor& x : inputs)
      out.push_back(tensor_parallel::VocabParallelLogits(x, weight, group_));
    return out;
  }
  std::map<std::string, tensor_parallel::ShardSpec> ShardDims() const override {
    return {{"weight", tensor_parallel::ShardSpec{0, 1}}};
  }

  torch::Tensor weight;

 private:
  ModelParallelGroup group_;
};

}  // namespace

absl::Status ValidateLlamaModelConfig(const LlamaModelConfig& c) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size()},
                                    {"context_length", c.context_length()},
                                    {"width", c.width()},
                                    {"num_heads", c.num_heads()},
                                    {"num_kv_heads", c.num_kv_heads()},
                                    {"num_layers", c.num_layers()},
                                    {"intermediate_size", c.intermediate_size()}}) {
    if (value <= 0) return Invalid(name, value, "must be positive");
  }
  if (c.width() % c.num_heads() != 0) {
    return Invalid("width", c.width(),
                   absl::StrCat("must be a multiple of llama.num_heads (", c.num_heads(), ")"));
  }
  if ((c.width() / c.num_heads()) % 2 != 0) {
    return Invalid("width", c.width(),
                   absl::StrCat("/ llama.num_heads (", c.num_heads(),
                                ") must be even: rotary embeddings rotate pairs of dimensions"));
  }
  if (c.num_heads() % c.num_kv_heads() != 0) {
    return Invalid("num_kv_heads", c.num_kv_heads(),
                   absl::StrCat("must divide llama.num_heads (", c.num_heads(), ")"));
  }
  // Finite and bounded (issue #42, class 5): norm_eps = 1e300 or inf trained
  // at a constant loss of ln(vocab), the norm swamping every activation.
  if (absl::Status s = CheckRealField("llama.rope_theta", c.rope_theta(), '(', 1, 1e12, ']',
                                      "the base of the rotary frequencies");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRealField("llama.norm_eps", c.norm_eps(), '(', 0, 1, ']',
                                      "a larger epsilon swamps the activations it normalises");
      !s.ok()) {
    return s;
  }
  return CheckRealField("llama.dropout", c.dropout(), '[', 0, 1, ')');
}

absl::Status ValidateLlamaParallelism(const LlamaModelConfig& c, int64_t tp,
                                      bool sequence_parallel) {
  if (sequence_parallel && tp <= 1) {
    return absl::InvalidArgumentError(
        "parallelism.sequence_parallel needs parallelism.tp > 1: it splits the sequence over the "
        "tensor-parallel ranks");
  }
  if (tp <= 1) return absl::OkStatus();
  if (sequence_parallel && c.context_length() % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama.context_length (", c.context_length(),
                     ") must be a multiple of parallelism.tp (", tp,
                     ") with parallelism.sequence_parallel: each rank holds a slice of the "
                     "sequence"));
  }
  // Fewer kv heads than ranks: each rank holds the one its query heads use,
  // shared with tp / num_kv_heads neighbours (LlamaKvReplicas).
  if (c.num_kv_heads() % tp != 0 && tp % c.num_kv_heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama.num_kv_heads (", c.num_kv_heads(), ") must be a multiple of parallelism.tp (", tp,
        "), each rank holding an equal share, or divide it, each kv head held by tp / "
        "num_kv_heads ranks"));
  }
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"num_heads", c.num_heads()},
                                    {"intermediate_size", c.intermediate_size()}}) {
    if (value % tp != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("llama.", name, " (", value, ") must be a multiple of parallelism.tp (", tp,
                       "): each tensor-parallel rank holds an equal share"));
    }
  }
  return absl::OkStatus();
}

RmsNormImpl::RmsNormImpl(int64_t width, double eps, const ModelParallelGroup& group)
    : eps_(eps), group_(group) {
  weight = register_parameter("weight", torch::ones({width}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  torch::Tensor x32 = x.to(torch::kFloat);
  torch::Tensor normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return tensor_parallel::SequenceParallelReplicated(weight, group_) * normed.to(x.scalar_type());
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

int64_t LlamaKvReplicas(const LlamaModelConfig& config, int64_t tp) {
  return tp > config.num_kv_heads() ? tp / config.num_kv_heads() : 1;
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaModelConfig& config,
                                       const ModelParallelGroup& group)
    : num_heads_(config.num_heads() / group.size),
      num_kv_heads_(config.num_kv_heads() * LlamaKvReplicas(config, group.size) / group.size),
      head_dim_(config.width() / config.num_heads()),
      rope_theta_(config.rope_theta()),
      group_(group) {
  TORCH_CHECK(ValidateLlamaModelConfig(config).ok(), ValidateLlamaModelConfig(config).ToString());
  const absl::Status parallel =
      ValidateLlamaParallelism(config, group.size, group.sequence_parallel);
  TORCH_CHECK(parallel.ok(), parallel.message());
  using tensor_parallel::ColumnParallelLinear;
  using tensor_parallel::RowParallelLinear;
  const int64_t heads = config.num_heads() * head_dim_, kv = config.num_kv_heads() * head_dim_;
  q_proj = register_module(
      "q_proj", NoBiasParallelLinear<ColumnParallelLinear>(config.width(), heads, group));
  const int64_t replicas = LlamaKvReplicas(config, group.size);
  k_proj = register_module(
      "k_proj", NoBiasParallelLinear<ColumnParallelLinear>(config.width(), kv, group, replicas));
  v_proj = register_module(
      "v_proj", NoBiasParallelLinear<ColumnParallelLinear>(config.width(), kv, group, replicas));
  o_proj = register_module("o_proj",
                           NoBiasParallelLinear<RowParallelLinear>(heads, config.width(), group));
  attn_dropout_ = register_module("attn_dropout", torch::nn::Dropout(config.dropout()));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& position_ids,
                                          const torch::Tensor& document_ids) {
  TORCH_CHECK(x.dim() == 3, "attention expects [batch, time, width], got ", x.sizes());
  const int64_t batch = x.size(0);
  // Under sequence parallelism x is this rank's sequence slice and each
  // projection all-gathers the whole sequence (three gathers where a fused
  // q/k/v projection would need one).
  torch::Tensor q = q_proj(x);
  const int64_t time = q.size(1);
  // [b, T, heads * d] -> [b, heads, T, d]
  q = q.view({batch, time, num_heads_, head_dim_}).transpose(1, 2);
  torch::Tensor k = k_proj(x).view({batch, time, num_kv_heads_, head_dim_}).transpose(1, 2);
  torch::Tensor v = v_proj(x).view({batch, time, num_kv_heads_, head_dim_}).transpose(1, 2);
  auto [cos, sin] = RotaryTables(time, head_dim_, rope_theta_, x.device());
  if (position_ids.defined()) {
    // Each token's row of the tables: [b, 1, T, d] over the heads.
    TORCH_CHECK(position_ids.dim() == 2 && position_ids.size(1) == time, "\"", kPositionIdsKey,
                "\" must be [rows, ", time, "], got ", position_ids.sizes());
    TORCH_CHECK(position_ids.numel() == 0 || position_ids.max().item<int64_t>() < time,
                "a position id reaches ", position_ids.max().item<int64_t>(),
                "; positions restart per document and stay below the row's length ", time);
    cos = torch::embedding(cos, position_ids).unsqueeze(1);
    sin = torch::embedding(sin, position_ids).unsqueeze(1);
  }
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
  // On a GPU without packed documents: LibTorch's fused attention (2.x), as
  // GPT's SelfAttention and PyTorch's Llama implementations run it; it never
  // materialises the [T, T] scores. The CPU keeps the explicit path below,
  // which every CPU test and reference is pinned to. (Not under tensor
  // parallelism with dropout: the fused kernel would draw the mask of this
  // rank's heads alone, not its slice of the dense one.)
  const double dropout = is_training() ? attn_dropout_->options.p() : 0.0;
  if (x.is_cuda() && !document_ids.defined() && !(group_.is_parallel() && dropout > 0)) {
    std::optional<torch::Tensor> fused =
        torch_compat::ScaledDotProductAttention(q, k, v, dropout, /*causal=*/true);
    if (fused.has_value()) {
      return o_proj(fused->transpose(1, 2).reshape({batch, time, num_heads_ * head_dim_}));
    }
  }
  torch::Tensor scores =
      torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
  torch::Tensor future =
      torch::ones({time, time}, torch::TensorOptions().dtype(torch::kBool).device(x.device()))
          .triu(/*diagonal=*/1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  if (document_ids.defined()) {
    scores = scores.masked_fill(CrossDocumentMask(document_ids, time),
                                -std::numeric_limits<double>::infinity());
  }
  torch::Tensor probs = torch::softmax(scores, -1, torch::kFloat).to(q.dtype());
  // Under tensor parallelism this rank's heads' slice of the dense mask.
  torch::Tensor weights =
      group_.is_parallel()
          ? tensor_parallel::ShardedDropout(probs, attn_dropout_->options.p(), is_training(),
                                            /*dim=*/1, group_)
          : attn_dropout_(probs);
  torch::Tensor out =
      torch::matmul(weights, v).transpose(1, 2).reshape({batch, time, num_heads_ * head_dim_});
  return o_proj(out);
}

SwiGluImpl::SwiGluImpl(int64_t width, int64_t hidden, const ModelParallelGroup& group) {
  using tensor_parallel::ColumnParallelLinear;
  using tensor_parallel::RowParallelLinear;
  gate_proj = register_module("gate_proj",
                              NoBiasParallelLinear<ColumnParallelLinear>(width, hidden, group));
  up_proj =
      register_module("up_proj", NoBiasParallelLinear<ColumnParallelLinear>(width, hidden, group));
  down_proj =
      register_module("down_proj", NoBiasParallelLinear<RowParallelLinear>(hidden, width, group));
}

torch::Tensor SwiGluImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

LlamaEmbeddingImpl::LlamaEmbeddingImpl(const LlamaModelConfig& config,
                                       const ModelParallelGroup& group)
    : LayerImpl("LlamaEmbedding"), context_length_(config.context_length()), group_(group) {
  // The dense table as the dense model draws it; a rank keeps its rows.
  torch::nn::Embedding table(config.vocab_size(), config.width());
  InitNormal(table->weight);
  tok_embed =
      register_module("tok_embed", tensor_parallel::VocabParallelEmbedding(table->weight, group));
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout()));
}

torch::Tensor LlamaEmbeddingImpl::Logits(const torch::Tensor& x) const {
  return tensor_parallel::VocabParallelLogits(x, tok_embed->weight, group_);
}

Activations LlamaEmbeddingImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  const torch::Tensor ids =
      EmbeddingInputIds(inputs, batch, "LlamaEmbedding", "llama", context_length_);
  // Under sequence parallelism the embeddings arrive reduce-scattered to this
  // rank's sequence slice: its slice of the dense mask.
  if (group_.sequence_parallel) {
    return {tensor_parallel::ShardedDropout(tok_embed(ids), dropout_->options.p(), is_training(),
                                            /*dim=*/1, group_)};
  }
  return {dropout_(tok_embed(ids))};
}

LlamaBlockImpl::LlamaBlockImpl(const LlamaModelConfig& config, const ModelParallelGroup& group)
    : LayerImpl("LlamaBlock") {
  group_ = group;
  input_layernorm =
      register_module("input_layernorm", RmsNorm(config.width(), config.norm_eps(), group));
  self_attn = register_module("self_attn", LlamaAttention(config, group));
  post_attention_layernorm = register_module("post_attention_layernorm",
                                             RmsNorm(config.width(), config.norm_eps(), group));
  mlp = register_module("mlp", SwiGlu(config.width(), config.intermediate_size(), group));
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout()));
}

Activations LlamaBlockImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  TORCH_CHECK(inputs.size() == 1, "LlamaBlock expects one activation, got ", inputs.size());
  torch::Tensor x = inputs[0];
  // Under sequence parallelism x is this rank's slice; attention sees the
  // whole sequence.
  const int64_t time = group_.sequence_parallel ? x.size(1) * group_.size : x.size(1);
  x = x + Dropout(self_attn(input_layernorm(x), PackedPositions(batch, time), DocumentIds(batch)));
  x = x + Dropout(mlp(post_attention_layernorm(x)));
  return {x};
}

torch::Tensor LlamaBlockImpl::Dropout(const torch::Tensor& y) {
  return group_.sequence_parallel
             ? tensor_parallel::ShardedDropout(y, dropout_->options.p(), is_training(), 1, group_)
             : dropout_(y);
}

int64_t LlamaBlockParameterCount(const LlamaModelConfig& c) {
  const int64_t head_dim = c.width() / c.num_heads();
  const int64_t attention = c.width() * c.num_heads() * head_dim * 2 +    // q, o
                            c.width() * c.num_kv_heads() * head_dim * 2;  // k, v
  const int64_t mlp = 3 * c.width() * c.intermediate_size();
  return attention + mlp + 2 * c.width();
}

absl::StatusOr<std::vector<LayerSpec>> MakeLlamaSpecs(const LlamaModelConfig& config) {
  if (absl::Status s = ValidateLlamaModelConfig(config); !s.ok()) return s;
  const int64_t table = config.vocab_size() * config.width();
  LayerFactory embed = [config](const LayerContext& ctx) {
    return std::make_shared<LlamaEmbeddingImpl>(config, ctx.model_parallel);
  };
  std::vector<LayerSpec> specs;
  if (config.tie_embeddings()) {
    specs.push_back(
        TiedLayerSpec("embed", embed).WithName("LlamaEmbedding").WithParameterCount(table));
  } else {
    specs.push_back(LayerSpec("LlamaEmbedding", embed).WithParameterCount(table));
  }
  for (int64_t i = 0; i < config.num_layers(); ++i) {
    specs.push_back(LayerSpec("LlamaBlock", [config](const LayerContext& ctx) {
                      return std::make_shared<LlamaBlockImpl>(config, ctx.model_parallel);
                    }).WithParameterCount(LlamaBlockParameterCount(config)));
  }
  specs.push_back(LayerSpec("FinalRmsNorm", [config](const LayerContext& ctx) {
                    return MakeModuleLayer(
                        RmsNorm(config.width(), config.norm_eps(), ctx.model_parallel),
                        "FinalRmsNorm");
                  }).WithParameterCount(config.width()));
  if (config.tie_embeddings()) {
    // The head reuses the embedding table: count its matmul like the table.
    // Through the embedding's Logits (under tensor parallelism this rank's
    // vocabulary columns, the input's gradient summed over the group).
    TiedForwardFn head = [](LayerImpl& shared, const Activations& inputs, const MicroBatch&) {
      const auto& embedding = dynamic_cast<const LlamaEmbeddingImpl&>(shared);
      Activations out;
      for (const torch::Tensor& x : inputs) out.push_back(embedding.Logits(x));
      return out;
    };
    specs.push_back(
        TiedLayerSpec("embed", embed, head).WithName("LmHead").WithParameterCount(table));
  } else {
    specs.push_back(LayerSpec("LmHead", [config](const LayerContext& ctx) -> Layer {
                      if (ctx.model_parallel.is_parallel()) {
                        return std::make_shared<VocabParallelHeadImpl>(
                            config.width(), config.vocab_size(), ctx.model_parallel);
                      }
                      return MakeModuleLayer(NoBiasLinear(config.width(), config.vocab_size()),
                                             "LmHead");
                    }).WithParameterCount(table));
  }
  return specs;
}

namespace {

// Vocabulary parallelism's first layer: the embedding's dropout of the token
// embeddings [b, T, width] summed from every pipe rank's rows (under sequence
// parallelism this rank's slice of the sequence, whose dropout draws the
// dense mask's slice, as LlamaEmbedding's does).
class LlamaEmbeddingDropoutImpl : public LayerImpl {
 public:
  LlamaEmbeddingDropoutImpl(const LlamaModelConfig& config, const ModelParallelGroup& group)
      : LayerImpl("LlamaEmbeddingDropout"),
        context_length_(config.context_length()),
        group_(group) {
    dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout()));
  }
  Activations Forward(const Activations& inputs, const MicroBatch&) override {
    TORCH_CHECK(inputs.size() == 1 && inputs[0].dim() == 3 && inputs[0].is_floating_point(),
                "LlamaEmbeddingDropout expects the token embeddings [batch, time, width]");
    const int64_t time = inputs[0].size(1) * (group_.sequence_parallel ? group_.size : 1);
    CheckSequenceLength(time, "llama", context_length_);
    if (!group_.sequence_parallel) return {dropout_(inputs[0])};
    return {tensor_parallel::ShardedDropout(inputs[0], dropout_->options.p(), is_training(), 1,
                                            group_)};
  }

 private:
  int64_t context_length_;
  ModelParallelGroup group_;
  torch::nn::Dropout dropout_{nullptr};
};

}  // namespace

absl::StatusOr<VocabularySplit> MakeLlamaVocabularySplit(const LlamaModelConfig& config) {
  VocabularySplit split;
  PP_ASSIGN_OR_RETURN(split.dense, MakeLlamaSpecs(config));
  split.body.push_back(LayerSpec("LlamaEmbeddingDropout", [config](const LayerContext& ctx) {
                         return std::make_shared<LlamaEmbeddingDropoutImpl>(config,
                                                                            ctx.model_parallel);
                       }).WithParameterCount(0));
  // The blocks and the final norm, as the dense list has them.
  const int64_t last = static_cast<int64_t>(split.dense.size()) - 1;
  for (int64_t i = 1; i < last; ++i) split.body.push_back(split.dense[i]);
  split.embedding_layer = 0;
  split.embedding_table = [](LayerImpl& layer) {
    return dynamic_cast<LlamaEmbeddingImpl&>(layer).tok_embed->weight;
  };
  if (config.tie_embeddings()) {
    split.embedding_name = "tied.embed.tok_embed.weight";
  } else {
    split.embedding_name = "layers.0.tok_embed.weight";
    split.head_layer = last;
    split.head_table = [](LayerImpl& layer) { return layer.named_parameters()["weight"]; };
    split.head_name = absl::StrCat("layers.", last, ".weight");
  }
  return split;
}

torch::Tensor LlamaLoss(const Activations& outputs, const MicroBatch& batch) {
  return GptLoss(outputs, batch);
}

torch::Tensor LlamaParallelLoss(const Activations& outputs, const MicroBatch& batch,
                                int64_t vocab_size, const ModelParallelGroup& group) {
  return GptParallelLoss(outputs, batch, vocab_size, group);
}

}  // namespace pp
