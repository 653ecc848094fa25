#include "models/transformer.h"

#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/torch_compat_attention.h"
#include "models/packed_sequence.h"
#include "pipeline/tensor_parallel/dropout.h"

namespace pp {

SelfAttentionImpl::SelfAttentionImpl(int64_t width, int64_t num_heads, double dropout,
                                     const ModelParallelGroup& group)
    : width_(width),
      num_heads_(num_heads / group.size),
      parallel_(group.is_parallel()),
      group_(group) {
  TORCH_CHECK(num_heads > 0 && width % num_heads == 0, "width (", width,
              ") must be a multiple of num_heads (", num_heads, ")");
  TORCH_CHECK(num_heads % group.size == 0, "num_heads (", num_heads,
              ") must be a multiple of the tensor-parallel size ", group.size);
  using tensor_parallel::ParallelLinearOptions;
  // No key bias: softmax is invariant to it, so its gradient is zero in
  // theory and rounding noise in practice, which Adam would blow up into
  // updates that differ between a pipeline and the sequential model.
  qkv_ = register_module(
      "qkv", tensor_parallel::ColumnParallelLinear(
                 ParallelLinearOptions(width, 3 * width).Bias(false).OutputBlocks(3), group));
  const int64_t local_width = width / group.size;
  q_bias_ = register_parameter("q_bias", torch::zeros({local_width}));
  v_bias_ = register_parameter("v_bias", torch::zeros({local_width}));
  proj_ = register_module(
      "proj", tensor_parallel::RowParallelLinear(ParallelLinearOptions(width, width), group));
  attn_dropout_ = register_module("attn_dropout", torch::nn::Dropout(dropout));
  out_dropout_ = register_module("out_dropout", torch::nn::Dropout(dropout));
}

const torch::Tensor& SelfAttentionImpl::FutureMask(int64_t time, const torch::Device& device) {
  // (An inference tensor, made under InferenceMode, could not serve autograd.)
  if (!future_.defined() || future_.size(0) != time || future_.device() != device ||
      future_.is_inference()) {
    future_ = torch::ones({time, time}, torch::TensorOptions().dtype(torch::kBool).device(device))
                  .triu(/*diagonal=*/1);
  }
  return future_;
}

const torch::Tensor& SelfAttentionImpl::AdditiveFutureMask(int64_t time,
                                                           const torch::Device& device) {
  if (!additive_future_.defined() || additive_future_.size(0) != time ||
      additive_future_.device() != device || additive_future_.is_inference()) {
    additive_future_ =
        torch::zeros({time, time}, torch::TensorOptions().dtype(torch::kFloat).device(device))
            .masked_fill_(FutureMask(time, device), std::numeric_limits<float>::lowest());
  }
  return additive_future_;
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, bool causal,
                                         const torch::Tensor& key_mask,
                                         const torch::Tensor& document_ids) {
  TORCH_CHECK(x.dim() == 3 && x.size(2) == width_, "attention expects [batch, time, ", width_,
              "], got ", x.sizes());
  const torch::Tensor projected = qkv_(x);
  const int64_t batch = projected.size(0);
  const int64_t time = projected.size(1);
  const int64_t local_width = projected.size(2) / 3;  // this rank's heads
  const int64_t head_width = local_width / num_heads_;
  // [batch, time, 3, heads, head_width] -> 3 x [batch, heads, time, head_width]
  torch::Tensor qkv =
      projected.view({batch, time, 3, num_heads_, head_width}).permute({2, 0, 3, 1, 4});
  // On a GPU without a key mask: LibTorch's fused attention (2.x), as
  // PyTorch's nn.MultiheadAttention runs it. It never materialises the
  // [time, time] scores, which the explicit path below reads and writes five
  // times: the GPU kit measured that path 9% slower than PyTorch on a width
  // 1024, context 512 GPT. The CPU keeps the explicit path, whose results
  // every CPU test and the sequential references are pinned to.
  // (Not under tensor parallelism with dropout: the fused kernel would draw
  // the mask of this rank's heads alone, not its slice of the dense one.)
  const double dropout = is_training() ? attn_dropout_->options.p() : 0.0;
  if (x.is_cuda() && !key_mask.defined() && !document_ids.defined() &&
      !(parallel_ && dropout > 0)) {
    std::optional<torch::Tensor> fused = torch_compat::ScaledDotProductAttention(
        qkv[0] + q_bias_.view({num_heads_, 1, head_width}), qkv[1],
        qkv[2] + v_bias_.view({num_heads_, 1, head_width}), dropout, causal);
    if (fused.has_value()) {
      return OutDropout(proj_(fused->transpose(1, 2).reshape({batch, time, local_width})));
    }
  }
  // [batch * heads, time, head_width] operands for the batched matmuls: the
  // bias adds keep the projection's (permuted) layout, so these reshapes copy.
  torch::Tensor q = (qkv[0] + q_bias_.view({num_heads_, 1, head_width}))
                        .reshape({batch * num_heads_, time, head_width});
  torch::Tensor k = qkv[1].reshape({batch * num_heads_, time, head_width});
  torch::Tensor v = (qkv[2] + v_bias_.view({num_heads_, 1, head_width}))
                        .reshape({batch * num_heads_, time, head_width});
  // Scores scaled by 1/sqrt(head_width), in place on bmm's fresh output (its
  // backward needs q and k, not the output): a multiplication where that
  // reciprocal is exact (head_width a power of 4), bit for bit the division's,
  // else the division. Not baddbmm's alpha with beta 0: LibTorch's CPU kernel
  // for small products (time^2 x head_width < 400) still reads the
  // uninitialised output there, and NaN left in that memory came back as NaN
  // scores (issue 29: context_length 3 with 4 heads trained NaN at step 1).
  const double root = std::sqrt(static_cast<double>(head_width));
  const bool exact = root == std::ldexp(1.0, std::ilogb(root));
  // The lowest finite value rather than -inf: a row whose keys are all masked
  // then gets uniform weights instead of NaN.
  const double kMasked = std::numeric_limits<float>::lowest();
  // fp32, an exact scale and the causal mask alone (the peer GPT's case):
  // scale and mask in the product, as baddbmm(mask, q, k^T, 1, 1/root), whose
  // beta 1 reads the mask (never uninitialised memory). The same bits as the
  // path below: a power-of-two scale is exact before or after the sum, and
  // float's lowest plus any score under 1e31 rounds back to lowest. But one
  // pass over the scores instead of three, and no masked_fill in backward
  // (the softmax's gradient is already 0 where its weight is).
  const bool fused = exact && causal && q.scalar_type() == torch::kFloat &&
                     !document_ids.defined() && !key_mask.defined();
  torch::Tensor scores;
  if (fused) {
    scores = torch::baddbmm(
        AdditiveFutureMask(time, x.device()).expand({batch * num_heads_, time, time}), q,
        k.transpose(1, 2), /*beta=*/1, /*alpha=*/1.0 / root);
  } else {
    scores = torch::bmm(q, k.transpose(1, 2));
    // Scale, mask and softmax in fp32 under bf16 (mixed precision: a bf16
    // softmax over long rows loses the small weights, and float's lowest value
    // used as the mask rounds to -inf in bf16). A no-op in fp32.
    if (scores.scalar_type() != torch::kFloat) scores = scores.to(torch::kFloat);
    if (exact) {
      scores.mul_(1.0 / root);
    } else {
      scores.div_(root);
    }
    // In place (no copy of the scores; the matmul's backward does not need
    // them), with the mask built once.
    if (causal) scores.masked_fill_(FutureMask(time, x.device()), kMasked);
  }
  if (document_ids.defined()) {
    scores.view({batch, num_heads_, time, time})
        .masked_fill_(CrossDocumentMask(document_ids, time), kMasked);
  }
  if (key_mask.defined()) {
    TORCH_CHECK(key_mask.dim() == 2 && key_mask.size(0) == batch && key_mask.size(1) == time,
                "attention mask must be [", batch, ", ", time, "], got ", key_mask.sizes());
    scores =
        scores.view({batch, num_heads_, time, time})
            .masked_fill(key_mask.to(torch::kBool).logical_not().view({batch, 1, 1, time}), kMasked)
            .view({batch * num_heads_, time, time});
  }
  torch::Tensor probs = torch::softmax(scores, /*dim=*/-1);
  // Under tensor parallelism each rank keeps its heads' slice of the dense
  // model's mask (drawn for every head, from a generator the group shares).
  probs = parallel_ ? tensor_parallel::ShardedDropout(probs.view({batch, num_heads_, time, time}),
                                                      dropout, is_training(),
                                                      /*dim=*/1, group_)
                          .view({batch * num_heads_, time, time})
                    : attn_dropout_(probs);
  torch::Tensor weights = probs.to(v.scalar_type());
  torch::Tensor out = torch::bmm(weights, v)
                          .view({batch, num_heads_, time, head_width})
                          .transpose(1, 2)
                          .reshape({batch, time, local_width});
  return OutDropout(proj_(out));
}

torch::Tensor SelfAttentionImpl::OutDropout(const torch::Tensor& y) {
  // Under sequence parallelism y is this rank's sequence slice.
  return group_.sequence_parallel ? tensor_parallel::ShardedDropout(y, out_dropout_->options.p(),
                                                                    is_training(), 1, group_)
                                  : out_dropout_(y);
}

std::map<std::string, tensor_parallel::ShardSpec> SelfAttentionImpl::ShardDims() const {
  if (!parallel_) return {};
  return {{"q_bias", {0, 1}}, {"v_bias", {0, 1}}};
}

MlpImpl::MlpImpl(int64_t width, int64_t hidden, double dropout, const ModelParallelGroup& group) {
  using tensor_parallel::ParallelLinearOptions;
  fc_in_ = register_module(
      "fc_in", tensor_parallel::ColumnParallelLinear(ParallelLinearOptions(width, hidden), group));
  fc_out_ = register_module(
      "fc_out", tensor_parallel::RowParallelLinear(ParallelLinearOptions(hidden, width), group));
  dropout_ = register_module("dropout", torch::nn::Dropout(dropout));
  group_ = group;
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  const torch::Tensor y = fc_out_(torch::gelu(fc_in_(x)));
  // Under sequence parallelism y is this rank's sequence slice: its slice of
  // the dense mask.
  return group_.sequence_parallel
             ? tensor_parallel::ShardedDropout(y, dropout_->options.p(), is_training(), 1, group_)
             : dropout_(y);
}

torch::Tensor Fp32LayerNormImpl::forward(const torch::Tensor& x) {
  if (x.scalar_type() == torch::kFloat && !sequence_group_.sequence_parallel) {
    return torch::nn::LayerNormImpl::forward(x);
  }
  auto param = [&](const torch::Tensor& p) {
    return p.defined()
               ? tensor_parallel::SequenceParallelReplicated(p, sequence_group_).to(torch::kFloat)
               : p;
  };
  return torch::layer_norm(x.to(torch::kFloat), options.normalized_shape(), param(weight),
                           param(bias), options.eps())
      .to(x.scalar_type());
}

Fp32LayerNorm MakeLayerNorm(int64_t width, const ModelParallelGroup& group) {
  Fp32LayerNorm norm(torch::nn::LayerNormOptions({width}));
  if (group.sequence_parallel) norm->set_sequence_parallel(group);
  return norm;
}

int64_t TransformerBlockParameterCount(int64_t width, int64_t hidden) {
  const int64_t attention = width * 3 * width + 2 * width + width * width + width;
  const int64_t mlp = width * hidden + hidden + hidden * width + width;
  const int64_t norms = 2 * 2 * width;
  return attention + mlp + norms;
}

torch::Tensor InputIds(const Activations& inputs, const MicroBatch& batch) {
  torch::Tensor ids = inputs.empty() ? batch.Get("input_ids") : inputs[0];
  TORCH_CHECK(!at::isFloatingType(ids.scalar_type()), "embedding expects integer token ids, got ",
              ids.scalar_type());
  return ids;
}

torch::Tensor EmbeddingInputIds(const Activations& inputs, const MicroBatch& batch,
                                absl::string_view layer, absl::string_view model,
                                int64_t context_length) {
  torch::Tensor ids = InputIds(inputs, batch);
  TORCH_CHECK(ids.dim() == 2, layer, " expects input_ids [batch, time], got ", ids.sizes());
  CheckSequenceLength(ids.size(1), model, context_length);
  return ids;
}

void CheckSequenceLength(int64_t time, absl::string_view model, int64_t context_length) {
  TORCH_CHECK(time <= context_length, "sequence length ", time, " exceeds ", model,
              ".context_length ", context_length);
}

std::pair<int64_t, int64_t> SequenceSlice(int64_t time, const ModelParallelGroup& group) {
  TORCH_CHECK(time % group.size == 0, "sequence length ", time,
              " must be a multiple of the tensor-parallel size ", group.size,
              " under sequence parallelism");
  const int64_t local = time / group.size;
  return {group.rank * local, local};
}

namespace internal_transformer {

absl::Status ValidateConfig(absl::string_view model,
                            std::initializer_list<std::pair<const char*, int64_t>> sizes,
                            int64_t width, int64_t num_heads, double dropout) {
  for (const auto& [name, value] : sizes) {
    if (value <= 0)
      return absl::InvalidArgumentError(
          absl::StrCat(model, ".", name, " (", value, ") must be positive"));
  }
  if (width % num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(model, ".width (", width,
                                                   ") must be a multiple of ", model,
                                                   ".num_heads (", num_heads, ")"));
  }
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(model, ".dropout (", dropout, ") must be in [0, 1)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateParallelism(absl::string_view model, int64_t tp, bool sequence_parallel,
                                 int64_t num_heads, int64_t mlp_hidden, int64_t context_length) {
  if (sequence_parallel && tp <= 1) {
    return absl::InvalidArgumentError(
        "parallelism.sequence_parallel needs parallelism.tp > 1: it splits the sequence over the "
        "tensor-parallel ranks");
  }
  if (tp <= 1) return absl::OkStatus();
  if (num_heads % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(model, ".num_heads (", num_heads, ") must be a multiple of parallelism.tp (",
                     tp, "): each tensor-parallel rank holds whole heads"));
  }
  if (mlp_hidden % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(model, "'s MLP hidden width (", mlp_hidden,
                                                   ") must be a multiple of parallelism.tp (", tp,
                                                   ")"));
  }
  if (sequence_parallel && context_length % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        model, ".context_length (", context_length, ") must be a multiple of parallelism.tp (", tp,
        ") with parallelism.sequence_parallel: each rank holds a slice of the "
        "sequence"));
  }
  return absl::OkStatus();
}

}  // namespace internal_transformer
}  // namespace pp
