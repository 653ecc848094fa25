// Building blocks shared by GPT and BERT: multi-head self-attention written
// from Linear layers and tensor ops, and the GELU MLP.
//
// These are plain torch::nn modules (not layers): models/gpt and models/bert
// put them inside their pp::LayerImpl blocks.
#ifndef MODELS_TRANSFORMER_H_
#define MODELS_TRANSFORMER_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/field_checks.h"
#include "common/status_macros.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_context.h"
#include "pipeline/tensor_parallel/linear.h"
#include "pipeline/tensor_parallel/sharded_module.h"

namespace pp {

// Self-attention over x [batch, time, width] with `num_heads` heads of
// width / num_heads each; a fused q/k/v projection (biases on q and v only)
// and an output projection. Under tensor parallelism (`group` of size tp) a
// rank holds num_heads / tp heads: the q/k/v projection is column-parallel
// (its rows for those heads of each of q, k, v), the output projection
// row-parallel; the weights are the dense layer's slices, and the attention
// dropout keeps its slice of the dense mask (tensor_parallel::ShardedDropout),
// so a run's results do not depend on tp.
// Not thread-safe (like any torch::nn::Module).
class SelfAttentionImpl : public torch::nn::Module, public tensor_parallel::ShardedModule {
 public:
  // REQUIRES: width % num_heads == 0, num_heads % tp == 0 (checked).
  SelfAttentionImpl(int64_t width, int64_t num_heads, double dropout,
                    const ModelParallelGroup& group = {});

  // `causal`: position t attends to positions <= t only. `key_mask`: optional
  // bool [batch, time], true where a key is a real token (padding is false);
  // queries never attend to masked keys.
  // key_mask [batch, time]: 0 = a key nobody attends to (padding);
  // document_ids [batch, time]: packed sequences (packed_sequence.h), each
  // query attends only to keys of its own document.
  torch::Tensor forward(const torch::Tensor& x, bool causal, const torch::Tensor& key_mask = {},
                        const torch::Tensor& document_ids = {});
  std::map<std::string, tensor_parallel::ShardSpec> ShardDims() const override;

 private:
  // [time, time] bool, true above the diagonal (the future), cached for the
  // last time and device seen.
  const torch::Tensor& FutureMask(int64_t time, const torch::Device& device);
  // The same as a float [time, time] to add: 0, and float's lowest value in
  // the future; cached likewise.
  const torch::Tensor& AdditiveFutureMask(int64_t time, const torch::Device& device);
  // The output projection's dropout (on this rank's sequence slice under
  // sequence parallelism).
  torch::Tensor OutDropout(const torch::Tensor& y);

  int64_t width_;
  int64_t num_heads_;  // this rank's heads
  bool parallel_ = false;
  ModelParallelGroup group_;  // rank and size, for the attention dropout's slice
  tensor_parallel::ColumnParallelLinear qkv_{nullptr};
  torch::Tensor q_bias_;
  torch::Tensor v_bias_;
  tensor_parallel::RowParallelLinear proj_{nullptr};
  torch::nn::Dropout attn_dropout_{nullptr};
  torch::nn::Dropout out_dropout_{nullptr};
  torch::Tensor future_;  // not a buffer: not saved, not moved by to()
  torch::Tensor additive_future_;
};
TORCH_MODULE(SelfAttention);

// Linear(width -> hidden) -> GELU -> Linear(hidden -> width) -> dropout; the
// first column-parallel and the second row-parallel under tensor parallelism
// (REQUIRES: hidden % tp == 0, checked).
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(int64_t width, int64_t hidden, double dropout, const ModelParallelGroup& group = {});
  torch::Tensor forward(const torch::Tensor& x);

 private:
  tensor_parallel::ColumnParallelLinear fc_in_{nullptr};
  tensor_parallel::RowParallelLinear fc_out_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  ModelParallelGroup group_;  // under sequence parallelism, the dropout's slice
};
TORCH_MODULE(Mlp);

// LayerNorm computed in fp32 whatever the input's dtype (mixed precision:
// bf16 has 8 significant bits, too few for the mean and variance of a wide
// row), returning the input's dtype. The parameters are LayerNorm's
// ("weight", "bias"), so checkpoints are unchanged; on fp32 input it is
// LayerNorm's own forward, bit for bit.
// Under sequence parallelism (set_sequence_parallel) it normalises this
// rank's sequence shard and its parameters' gradients are summed over the
// model group (tensor_parallel::SequenceParallelReplicated).
class Fp32LayerNormImpl : public torch::nn::LayerNormImpl {
 public:
  using torch::nn::LayerNormImpl::LayerNormImpl;
  torch::Tensor forward(const torch::Tensor& x);
  void set_sequence_parallel(const ModelParallelGroup& group) { sequence_group_ = group; }

 private:
  ModelParallelGroup sequence_group_;  // size 1 unless sequence parallel
};
TORCH_MODULE(Fp32LayerNorm);

// An Fp32LayerNorm over the last dimension of size `width`, sequence
// parallel when `group` is.
Fp32LayerNorm MakeLayerNorm(int64_t width, const ModelParallelGroup& group = {});

// Trainable parameters of one attention + MLP + two LayerNorms, for the
// partitioners' declared counts.
int64_t TransformerBlockParameterCount(int64_t width, int64_t hidden);

// Token ids for an embedding layer: the first activation when the stage was
// given one, else the micro-batch's "input_ids" (the first stage reads its
// input from the data).
// Throws c10::Error when neither is there or the ids are not integers.
torch::Tensor InputIds(const Activations& inputs, const MicroBatch& batch);

// InputIds checked for an embedding layer of a model with `context_length`
// positions: [batch, time] (else c10::Error naming `layer`) and
// CheckSequenceLength.
torch::Tensor EmbeddingInputIds(const Activations& inputs, const MicroBatch& batch,
                                absl::string_view layer, absl::string_view model,
                                int64_t context_length);

// Throws c10::Error naming `<model>.context_length` when a sequence of `time`
// tokens is longer than the model's `context_length` positions.
void CheckSequenceLength(int64_t time, absl::string_view model, int64_t context_length);

// Under sequence parallelism, this rank's slice of a sequence of `time`
// tokens: {first token, tokens}. Throws c10::Error unless the group's size
// divides `time`.
std::pair<int64_t, int64_t> SequenceSlice(int64_t time, const ModelParallelGroup& group);

namespace internal_transformer {

absl::Status ValidateConfig(absl::string_view model,
                            std::initializer_list<std::pair<const char*, int64_t>> sizes,
                            int64_t width, int64_t num_heads, double dropout);
absl::Status ValidateParallelism(absl::string_view model, int64_t tp, bool sequence_parallel,
                                 int64_t num_heads, int64_t mlp_hidden, int64_t context_length);

}  // namespace internal_transformer

// The checks GPT's and BERT's configs share. `Config` is either's message
// (models/gpt/gpt_config.proto, models/bert/bert_config.proto), which name
// the fields read here alike; errors name `<model>.<field>`: every size
// positive, width a multiple of num_heads, dropout in [0, 1).
template <typename Config>
absl::Status ValidateTransformerConfig(absl::string_view model, const Config& c) {
  return internal_transformer::ValidateConfig(model,
                                              {{"vocab_size", c.vocab_size()},
                                               {"context_length", c.context_length()},
                                               {"width", c.width()},
                                               {"num_heads", c.num_heads()},
                                               {"num_layers", c.num_layers()},
                                               {"mlp_ratio", c.mlp_ratio()}},
                                              c.width(), c.num_heads(), c.dropout());
}

// What tensor parallelism of size `tp` needs of such a config, with errors
// naming `<model>.<field>` and what would divide: heads and the MLP's hidden
// width (mlp_ratio x width) split evenly; under sequence parallelism tp > 1
// and the sequence (`<model>.context_length`, every window's length) split
// evenly. (Dropout is fine: each rank keeps its slice of the dense mask.)
template <typename Config>
absl::Status ValidateTransformerParallelism(absl::string_view model, const Config& c, int64_t tp,
                                            bool sequence_parallel) {
  return internal_transformer::ValidateParallelism(model, tp, sequence_parallel, c.num_heads(),
                                                   c.mlp_ratio() * c.width(), c.context_length());
}

// What a run's config is held to before launch (a registration's validate)
// beyond ValidateTransformerConfig: upper bounds, and the lower bounds of the
// fields whose floor the model's data decides.
struct TransformerFieldBounds {
  int64_t min_context_length = 1;
  absl::string_view context_length_why;  // where the floor comes from
  int64_t min_vocab_size = 1;
  absl::string_view vocab_size_why;
};

// GPT's and BERT's shared fields in their ranges (common/field_checks.h),
// errors naming `<model>.<field>`: context_length in [min, 65536], width in
// [1, 65536], num_heads in [1, width], num_layers in [1, 100000], mlp_ratio in
// [1, 64], dropout in [0, 1), vocab_size in [min, 2^24].
template <typename Config>
absl::Status CheckTransformerFields(absl::string_view model, const Config& c,
                                    const TransformerFieldBounds& bounds) {
  const auto name = [model](absl::string_view field) { return absl::StrCat(model, ".", field); };
  PP_RETURN_IF_ERROR(CheckIntField(name("context_length"), c.context_length(),
                                   bounds.min_context_length, 65536, bounds.context_length_why));
  PP_RETURN_IF_ERROR(CheckIntField(name("width"), c.width(), 1, 65536));
  PP_RETURN_IF_ERROR(CheckIntField(name("num_heads"), c.num_heads(), 1,
                                   std::max<int64_t>(1, c.width()), "at most width"));
  PP_RETURN_IF_ERROR(CheckIntField(name("num_layers"), c.num_layers(), 1, 100000));
  PP_RETURN_IF_ERROR(CheckIntField(name("mlp_ratio"), c.mlp_ratio(), 1, 64));
  PP_RETURN_IF_ERROR(CheckRealField(name("dropout"), c.dropout(), '[', 0, 1, ')'));
  return CheckIntField(name("vocab_size"), c.vocab_size(), bounds.min_vocab_size, int64_t{1} << 24,
                       bounds.vocab_size_why);
}

// For a layer's constructor: throws c10::Error with
// ValidateTransformerParallelism's message when `group` cannot split `c`.
template <typename Config>
void CheckTransformerParallelism(absl::string_view model, const Config& c,
                                 const ModelParallelGroup& group) {
  const absl::Status status =
      ValidateTransformerParallelism(model, c, group.size, group.sequence_parallel);
  TORCH_CHECK(status.ok(), status.message());
}

}  // namespace pp

#endif  // MODELS_TRANSFORMER_H_
