#include "models/gpt/gpt.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "models/packed_sequence.h"
#include "pipeline/runtime/micro_batch_source.h"
#include "pipeline/tensor_parallel/dropout.h"
#include "pipeline/tensor_parallel/linear.h"

namespace pp {

absl::Status ValidateGptModelConfig(const GptModelConfig& config) {
  return ValidateTransformerConfig("gpt", config);
}

absl::Status ValidateGptParallelism(const GptModelConfig& config, int64_t tp,
                                    bool sequence_parallel) {
  return ValidateTransformerParallelism("gpt", config, tp, sequence_parallel);
}

namespace {

// The dense token table and the position table, drawn as the dense model
// draws them (so tp shards and vocabulary-parallel shards are its rows):
// LibTorch's Embedding init, then GPT-2's N(0, 0.02) rather than N(0, 1),
// which would make the tied LM head's initial logits huge.
struct GptTables {
  torch::Tensor tokens;
  torch::nn::Embedding positions{nullptr};
};
GptTables DrawGptTables(const GptModelConfig& config) {
  torch::nn::Embedding table(config.vocab_size(), config.width());
  GptTables tables;
  tables.positions = torch::nn::Embedding(config.context_length(), config.width());
  torch::NoGradGuard no_grad;
  table->weight.normal_(0.0, 0.02);
  tables.positions->weight.normal_(0.0, 0.02);
  tables.tokens = table->weight;
  return tables;
}

// The positions of a micro-batch of `time` tokens: restarting at each
// document of a packed one ([rows, time]), else 0..time-1 ([time]).
torch::Tensor Positions(const MicroBatch& batch, int64_t time, const torch::Device& device) {
  torch::Tensor positions = PackedPositions(batch, time);
  if (positions.defined()) return positions;
  return torch::arange(time, torch::TensorOptions().dtype(torch::kLong).device(device));
}

}  // namespace

GptEmbeddingImpl::GptEmbeddingImpl(const GptModelConfig& config, const ModelParallelGroup& group)
    : LayerImpl("GptEmbedding"), group_(group) {
  CheckTransformerParallelism("gpt", config, group);
  GptTables tables = DrawGptTables(config);
  pos_embed = register_module("pos_embed", tables.positions);
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout()));
  tok_embed =
      register_module("tok_embed", tensor_parallel::VocabParallelEmbedding(tables.tokens, group));
}

torch::Tensor GptEmbeddingImpl::Logits(const torch::Tensor& x) const {
  return tensor_parallel::VocabParallelLogits(x, tok_embed->weight, group_);
}

Activations GptEmbeddingImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  const torch::Tensor ids =
      EmbeddingInputIds(inputs, batch, "GptEmbedding", "gpt", pos_embed->weight.size(0));
  const int64_t time = ids.size(1);
  const torch::Tensor positions = Positions(batch, time, ids.device());
  const bool packed = positions.dim() == 2;
  if (!group_.sequence_parallel) return {dropout_(tok_embed(ids) + pos_embed(positions))};
  // Sequence parallelism: the token embeddings arrive reduce-scattered to this
  // rank's slice of the sequence; its positions' rows of the (replicated)
  // table, whose gradient the group sums; the slice of the dense mask.
  const auto [begin, local] = SequenceSlice(time, group_);
  const torch::Tensor table =
      tensor_parallel::SequenceParallelReplicated(pos_embed->weight, group_);
  const torch::Tensor x =
      tok_embed(ids) + torch::embedding(table, positions.narrow(packed ? 1 : 0, begin, local));
  return {tensor_parallel::ShardedDropout(x, dropout_->options.p(), is_training(), 1, group_)};
}

GptPositionEmbeddingImpl::GptPositionEmbeddingImpl(const GptModelConfig& config,
                                                   const ModelParallelGroup& group)
    : LayerImpl("GptPositionEmbedding"), group_(group) {
  CheckTransformerParallelism("gpt", config, group);
  // Drawn as GptEmbedding draws it (the token table is drawn and dropped),
  // so this layer starts as the dense model's position table.
  pos_embed = register_module("pos_embed", DrawGptTables(config).positions);
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout()));
}

Activations GptPositionEmbeddingImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  TORCH_CHECK(inputs.size() == 1 && inputs[0].dim() == 3 && inputs[0].is_floating_point(),
              "GptPositionEmbedding expects the token embeddings [batch, time, width]");
  const torch::Tensor& tokens = inputs[0];
  const int64_t local = tokens.size(1);
  const int64_t time = group_.sequence_parallel ? local * group_.size : local;
  CheckSequenceLength(time, "gpt", pos_embed->weight.size(0));
  const torch::Tensor positions = Positions(batch, time, tokens.device());
  if (!group_.sequence_parallel) return {dropout_(tokens + pos_embed(positions))};
  // Sequence parallelism: the tokens are this rank's slice of the sequence;
  // its positions' rows of the (replicated) table, whose gradient the group
  // sums, as GptEmbedding does.
  const torch::Tensor table =
      tensor_parallel::SequenceParallelReplicated(pos_embed->weight, group_);
  const bool packed = positions.dim() == 2;
  const torch::Tensor x =
      tokens +
      torch::embedding(table, positions.narrow(packed ? 1 : 0, group_.rank * local, local));
  return {tensor_parallel::ShardedDropout(x, dropout_->options.p(), is_training(), 1, group_)};
}

TransformerBlockImpl::TransformerBlockImpl(const GptModelConfig& config,
                                           const ModelParallelGroup& group)
    : LayerImpl("TransformerBlock") {
  CheckTransformerParallelism("gpt", config, group);
  ln1_ = register_module("ln1", MakeLayerNorm(config.width(), group));
  attn_ = register_module(
      "attn", SelfAttention(config.width(), config.num_heads(), config.dropout(), group));
  ln2_ = register_module("ln2", MakeLayerNorm(config.width(), group));
  mlp_ = register_module(
      "mlp", Mlp(config.width(), config.mlp_ratio() * config.width(), config.dropout(), group));
}

Activations TransformerBlockImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  TORCH_CHECK(inputs.size() == 1, "TransformerBlock expects one activation, got ", inputs.size());
  torch::Tensor x = inputs[0];
  x = x + attn_(ln1_(x), /*causal=*/true, /*key_mask=*/torch::Tensor(), DocumentIds(batch));
  x = x + mlp_(ln2_(x));
  return {x};
}

namespace {

// The blocks and the final norm (both spec lists end with them).
void AppendGptBody(const GptModelConfig& config, std::vector<LayerSpec>& specs) {
  for (int64_t i = 0; i < config.num_layers(); ++i) {
    specs.push_back(LayerSpec("TransformerBlock",
                              [config](const LayerContext& ctx) {
                                return std::make_shared<TransformerBlockImpl>(config,
                                                                              ctx.model_parallel);
                              })
                        .WithParameterCount(TransformerBlockParameterCount(
                            config.width(), config.mlp_ratio() * config.width())));
  }
  specs.push_back(LayerSpec("FinalLayerNorm", [width = config.width()](const LayerContext& ctx) {
                    return MakeModuleLayer(MakeLayerNorm(width, ctx.model_parallel),
                                           "FinalLayerNorm");
                  }).WithParameterCount(2 * config.width()));
}

}  // namespace

absl::StatusOr<std::vector<LayerSpec>> MakeGptSpecs(const GptModelConfig& config) {
  if (absl::Status s = ValidateGptModelConfig(config); !s.ok()) return s;
  const int64_t embed_params = (config.vocab_size() + config.context_length()) * config.width();
  LayerFactory embed = [config](const LayerContext& ctx) {
    return std::make_shared<GptEmbeddingImpl>(config, ctx.model_parallel);
  };
  std::vector<LayerSpec> specs;
  specs.push_back(
      TiedLayerSpec("embed", embed).WithName("GptEmbedding").WithParameterCount(embed_params));
  AppendGptBody(config, specs);
  // The head reuses the embedding table: count its matmul like the table.
  // Through the embedding's Logits: x @ table^T, and under tensor
  // parallelism this rank's vocabulary columns with the input's gradient
  // summed over the group.
  TiedForwardFn head = [](LayerImpl& shared, const Activations& inputs, const MicroBatch&) {
    const auto& embedding = dynamic_cast<const GptEmbeddingImpl&>(shared);
    Activations out;
    for (const torch::Tensor& x : inputs) out.push_back(embedding.Logits(x));
    return out;
  };
  specs.push_back(TiedLayerSpec("embed", embed, head)
                      .WithName("LmHead")
                      .WithParameterCount(config.vocab_size() * config.width()));
  return specs;
}

absl::StatusOr<VocabularySplit> MakeGptVocabularySplit(const GptModelConfig& config) {
  VocabularySplit split;
  PP_ASSIGN_OR_RETURN(split.dense, MakeGptSpecs(config));
  split.body.push_back(LayerSpec("GptPositionEmbedding", [config](const LayerContext& ctx) {
                         return std::make_shared<GptPositionEmbeddingImpl>(config,
                                                                           ctx.model_parallel);
                       }).WithParameterCount(config.context_length() * config.width()));
  AppendGptBody(config, split.body);
  split.embedding_layer = 0;
  split.embedding_table = [](LayerImpl& layer) {
    return dynamic_cast<GptEmbeddingImpl&>(layer).tok_embed->weight;
  };
  split.embedding_name = "tied.embed.tok_embed.weight";
  // The body's first layer is what remains of the tied embedding module.
  split.dense_name = [](const std::string& name) {
    const std::string first = "layers.0.";
    return name.rfind(first, 0) == 0 ? "tied.embed." + name.substr(first.size()) : name;
  };
  return split;
}

torch::Tensor GptLoss(const Activations& outputs, const MicroBatch& batch) {
  TORCH_CHECK(outputs.size() == 1, "GptLoss expects one output (logits), got ", outputs.size());
  const torch::Tensor& logits = outputs[0];
  const torch::Tensor& labels = batch.Get("labels");
  TORCH_CHECK(logits.dim() == 3 && labels.sizes() == logits.sizes().slice(0, 2), "GptLoss: logits ",
              logits.sizes(), " do not match labels ", labels.sizes());
  if (!batch.Has(kLossMaskKey)) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(2)}),
                                                labels.reshape({-1}));
  }
  // Per-token loss (micro_batch_source.h): the sum over the mask.
  return ReduceTokenLosses(
      torch::nn::functional::cross_entropy(
          logits.reshape({-1, logits.size(2)}), labels.reshape({-1}),
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone))
          .view(labels.sizes()),
      batch);
}

torch::Tensor GptParallelLoss(const Activations& outputs, const MicroBatch& batch,
                              int64_t vocab_size, const ModelParallelGroup& group) {
  TORCH_CHECK(outputs.size() == 1, "GptParallelLoss expects one output (logits), got ",
              outputs.size());
  const torch::Tensor& logits = outputs[0];
  const torch::Tensor& labels = batch.Get("labels");
  TORCH_CHECK(logits.dim() == 3 && labels.sizes() == logits.sizes().slice(0, 2),
              "GptParallelLoss: logits ", logits.sizes(), " do not match labels ", labels.sizes());
  return ReduceTokenLosses(
      tensor_parallel::VocabParallelCrossEntropy(logits, labels, vocab_size, group), batch);
}

}  // namespace pp
