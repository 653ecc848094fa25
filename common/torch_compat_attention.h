// Fused attention where the LibTorch has it: the part of the LibTorch
// differences (common/torch_compat.h) that the models' attention needs, in a
// target of its own so that changing it rebuilds only the models.
#ifndef COMMON_TORCH_COMPAT_ATTENTION_H_
#define COMMON_TORCH_COMPAT_ATTENTION_H_

#include <optional>

#include <ATen/ATen.h>

namespace pp::torch_compat {

// at::scaled_dot_product_attention(q, k, v, no mask, dropout, is_causal) on
// [batch, heads, time, head_width] operands (2.x: fused flash /
// memory-efficient kernels on a GPU); nullopt in LibTorch 1.13, which has none.
std::optional<at::Tensor> ScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, double dropout,
                                                    bool causal);

}  // namespace pp::torch_compat

#endif  // COMMON_TORCH_COMPAT_ATTENTION_H_
