// AdamW over all of a parameter group's tensors at once: each of the update's
// operations is one multi-tensor (foreach) call over the whole list instead of
// one call per parameter (LibTorch's torch::optim::AdamW loops over the
// parameters, issuing seven operations and two temporaries for each). On a
// GPU a foreach call is a few kernels for every tensor together; on the CPU it
// saves the per-parameter state look-ups and a temporary per parameter.
//
// The arithmetic is torch::optim::AdamW's (LibTorch 1.13 and 2.x: decoupled
// weight decay p *= 1 - lr * wd first, then the moments, denom =
// sqrt(v) / sqrt(1 - beta2^t) + eps, p += -lr / (1 - beta1^t) * m / denom),
// operation for operation, so on the CPU the result is bit for bit the same
// (multi_tensor_adamw_test compares them). It is a torch::optim::AdamW: the
// same options and the same per-parameter state (AdamWParamState), so
// checkpoints save and load it unchanged. AMSGrad falls back to AdamW's own
// loop.
//
// Thread-safety: as torch::optim::AdamW (one step at a time).
#ifndef PIPELINE_RUNTIME_MULTI_TENSOR_ADAMW_H_
#define PIPELINE_RUNTIME_MULTI_TENSOR_ADAMW_H_

#include <vector>

#include <torch/torch.h>

namespace pp {

class MultiTensorAdamW : public torch::optim::AdamW {
 public:
  MultiTensorAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions options)
      : torch::optim::AdamW(std::move(params), std::move(options)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_MULTI_TENSOR_ADAMW_H_
