#include "pipeline/tensor_parallel/dropout.h"

#include <vector>

namespace pp {
namespace tensor_parallel {

torch::Tensor ShardedDropout(const torch::Tensor& local, double p, bool training, int64_t dim,
                             const ModelParallelGroup& group) {
  TORCH_CHECK(p >= 0 && p < 1, "ShardedDropout: p (", p, ") must be in [0, 1)");
  if (!training || p == 0 || local.numel() == 0) return local;
  dim = c10::maybe_wrap_dim(dim, local.dim());
  std::vector<int64_t> whole = local.sizes().vec();
  const int64_t n = whole[dim];
  whole[dim] *= group.size;
  // at::dropout's non-fused path: the noise in the input's dtype, drawn over
  // the whole shape, scaled, multiplied (so autograd's backward is the same
  // multiplication).
  torch::Tensor noise = torch::empty(whole, local.options().requires_grad(false));
  noise.bernoulli_(1 - p);
  noise.div_(1 - p);
  return local * noise.narrow(dim, group.rank * n, n);
}

}  // namespace tensor_parallel
}  // namespace pp
