#include "pipeline/runtime/multi_tensor_adamw.h"

#include <cmath>
#include <memory>
#include <tuple>

#include "common/torch_compat.h"

namespace pp {

torch::Tensor MultiTensorAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (torch::optim::OptimizerParamGroup& group : param_groups()) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    if (options.amsgrad()) {
      // Not used by pipe; AdamW's own loop keeps it correct.
      return torch::optim::AdamW::step(closure);
    }
  }
  for (torch::optim::OptimizerParamGroup& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const double beta1 = std::get<0>(options.betas());
    const double beta2 = std::get<1>(options.betas());
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    // Per parameter, as AdamW computes them from each one's own step count
    // (equal unless parameters joined at different steps).
    std::vector<at::Scalar> bias2_sqrts, neg_step_sizes;
    for (const torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "AdamW does not support sparse gradients");
      std::unique_ptr<torch::optim::OptimizerParamState>& slot =
          state_[torch_compat::OptimizerStateKeyOf(p)];
      if (slot == nullptr) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      state.step(state.step() + 1);
      const double bias_correction1 = 1 - std::pow(beta1, state.step());
      const double bias_correction2 = 1 - std::pow(beta2, state.step());
      bias2_sqrts.emplace_back(std::sqrt(bias_correction2));
      neg_step_sizes.emplace_back(-(options.lr() / bias_correction1));
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(state.exp_avg());
      exp_avg_sqs.push_back(state.exp_avg_sq());
    }
    if (params.empty()) continue;
    // AdamW's operations, in its order, each over the whole list.
    if (options.weight_decay() != 0) {
      at::_foreach_mul_(params, 1 - options.lr() * options.weight_decay());
    }
    at::_foreach_mul_(exp_avgs, beta1);
    at::_foreach_add_(exp_avgs, grads, 1 - beta1);
    at::_foreach_mul_(exp_avg_sqs, beta2);
    at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2);
    std::vector<torch::Tensor> denoms = at::_foreach_sqrt(exp_avg_sqs);
    at::_foreach_div_(denoms, bias2_sqrts);
    at::_foreach_add_(denoms, options.eps());
    at::_foreach_addcdiv_(params, exp_avgs, denoms, neg_step_sizes);
  }
  return loss;
}

}  // namespace pp
