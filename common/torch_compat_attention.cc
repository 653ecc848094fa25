#include "common/torch_compat_attention.h"

#include <torch/version.h>

namespace pp::torch_compat {

std::optional<at::Tensor> ScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, double dropout,
                                                    bool causal) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout, causal);
#else
  (void)q;
  (void)k;
  (void)v;
  (void)dropout;
  (void)causal;
  return std::nullopt;
#endif
}

}  // namespace pp::torch_compat
