#include "models/transformer.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pp {
namespace {

// `linear` on x [..., in] as one addmm over the flattened rows. LibTorch
// 1.13's C++ torch::nn::Linear runs a 3-D input as matmul and then a separate
// bias add (an extra pass over the output, and another autograd node), where
// PyTorch's F.linear fuses the two for a contiguous 3-D input.
torch::Tensor FusedLinear(torch::nn::Linear& linear, const torch::Tensor& x) {
  if (x.dim() == 2 || !linear->bias.defined()) return linear->forward(x);
  std::vector<int64_t> sizes = x.sizes().vec();
  torch::Tensor out = torch::addmm(linear->bias, x.reshape({-1, sizes.back()}), linear->weight.t());
  sizes.back() = out.size(1);
  return out.view(sizes);
}

}  // namespace

SelfAttentionImpl::SelfAttentionImpl(int64_t width, int64_t num_heads, double dropout)
    : width_(width), num_heads_(num_heads) {
  TORCH_CHECK(num_heads > 0 && width % num_heads == 0, "width (", width,
              ") must be a multiple of num_heads (", num_heads, ")");
  // No key bias: softmax is invariant to it, so its gradient is zero in
  // theory and rounding noise in practice, which Adam would blow up into
  // updates that differ between a pipeline and the sequential model.
  qkv_ = register_module("qkv",
                         torch::nn::Linear(torch::nn::LinearOptions(width, 3 * width).bias(false)));
  q_bias_ = register_parameter("q_bias", torch::zeros({width}));
  v_bias_ = register_parameter("v_bias", torch::zeros({width}));
  proj_ = register_module("proj", torch::nn::Linear(width, width));
  attn_dropout_ = register_module("attn_dropout", torch::nn::Dropout(dropout));
  out_dropout_ = register_module("out_dropout", torch::nn::Dropout(dropout));
}

const torch::Tensor& SelfAttentionImpl::CausalBias(int64_t time, const torch::Tensor& like) {
  if (!causal_bias_.defined() || causal_bias_.size(0) != time ||
      causal_bias_.device() != like.device() || causal_bias_.scalar_type() != like.scalar_type()) {
    // The lowest finite value rather than -inf: a row whose keys are all
    // masked then gets uniform weights instead of NaN.
    causal_bias_ = torch::full({time, time}, std::numeric_limits<float>::lowest(), like.options())
                       .triu(/*diagonal=*/1);
  }
  return causal_bias_;
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, bool causal,
                                         const torch::Tensor& key_mask) {
  TORCH_CHECK(x.dim() == 3 && x.size(2) == width_, "attention expects [batch, time, ", width_,
              "], got ", x.sizes());
  const int64_t batch = x.size(0);
  const int64_t time = x.size(1);
  const int64_t head_width = width_ / num_heads_;
  // [batch, time, 3, heads, head_width] -> 3 x [batch, heads, time, head_width]
  torch::Tensor qkv =
      qkv_(x).view({batch, time, 3, num_heads_, head_width}).permute({2, 0, 3, 1, 4});
  // [batch * heads, time, head_width] operands for the batched matmuls: the
  // bias adds keep the projection's (permuted) layout, so these reshapes copy.
  torch::Tensor q = (qkv[0] + q_bias_.view({num_heads_, 1, head_width}))
                        .reshape({batch * num_heads_, time, head_width});
  torch::Tensor k = qkv[1].reshape({batch * num_heads_, time, head_width});
  torch::Tensor v = (qkv[2] + v_bias_.view({num_heads_, 1, head_width}))
                        .reshape({batch * num_heads_, time, head_width});
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_width));
  // Causal: the mask is an additive bias and the scale the product's alpha,
  // both folded into one batched matmul (like PyTorch's nn.MultiheadAttention),
  // the mask built once.
  torch::Tensor scores =
      causal ? torch::baddbmm(CausalBias(time, x), q, k.transpose(1, 2), /*beta=*/1, scale)
             : torch::bmm(q, k.transpose(1, 2)) * scale;
  if (key_mask.defined()) {
    TORCH_CHECK(key_mask.dim() == 2 && key_mask.size(0) == batch && key_mask.size(1) == time,
                "attention mask must be [", batch, ", ", time, "], got ", key_mask.sizes());
    scores = scores.view({batch, num_heads_, time, time})
                 .masked_fill(key_mask.to(torch::kBool).logical_not().view({batch, 1, 1, time}),
                              std::numeric_limits<float>::lowest())
                 .view({batch * num_heads_, time, time});
  }
  torch::Tensor weights = attn_dropout_(torch::softmax(scores, /*dim=*/-1));
  torch::Tensor out = torch::bmm(weights, v)
                          .view({batch, num_heads_, time, head_width})
                          .transpose(1, 2)
                          .reshape({batch, time, width_});
  return out_dropout_(FusedLinear(proj_, out));
}

MlpImpl::MlpImpl(int64_t width, int64_t hidden, double dropout) {
  fc_in_ = register_module("fc_in", torch::nn::Linear(width, hidden));
  fc_out_ = register_module("fc_out", torch::nn::Linear(hidden, width));
  dropout_ = register_module("dropout", torch::nn::Dropout(dropout));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return dropout_(FusedLinear(fc_out_, torch::gelu(FusedLinear(fc_in_, x))));
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

absl::Status ValidateTransformerConfig(absl::string_view model,
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

}  // namespace pp
