#include "pipeline/runtime/optimizer.h"

#include <set>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "pipeline/runtime/multi_tensor_adamw.h"

namespace pp {

absl::Status ValidateOptimizerConfig(const OptimizerConfig& c) {
  if (c.name != "sgd" && c.name != "adamw") {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer '", c.name, "' is unknown; valid: sgd, adamw"));
  }
  if (!(c.lr >= 0.0))
    return absl::InvalidArgumentError(absl::StrCat("lr (", c.lr, ") must be >= 0"));
  if (c.momentum < 0.0) {
    return absl::InvalidArgumentError(absl::StrCat("momentum (", c.momentum, ") must be >= 0"));
  }
  if (c.weight_decay < 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay (", c.weight_decay, ") must be >= 0"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLrSchedule(const LrScheduleConfig& c) {
  if (c.name == "constant") return absl::OkStatus();
  if (c.name != "warmup_cosine") {
    return absl::InvalidArgumentError(
        absl::StrCat("lr schedule '", c.name, "' is unknown; valid: constant, warmup_cosine"));
  }
  if (c.warmup_steps < 0 || c.total_steps <= c.warmup_steps) {
    return absl::InvalidArgumentError(absl::StrCat("warmup_cosine needs 0 <= warmup_steps (",
                                                   c.warmup_steps, ") < total_steps (",
                                                   c.total_steps, ")"));
  }
  return absl::OkStatus();
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const OptimizerConfig& c,
                                                       std::vector<torch::Tensor> params) {
  if (c.name == "adamw") {
    // torch::optim::AdamW's arithmetic, bit for bit, in multi-tensor passes.
    return std::make_unique<MultiTensorAdamW>(std::move(params),
                                              torch::optim::AdamWOptions(c.lr)
                                                  .betas(std::make_tuple(c.beta1, c.beta2))
                                                  .eps(c.eps)
                                                  .weight_decay(c.weight_decay));
  }
  return std::make_unique<torch::optim::SGD>(
      std::move(params),
      torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
}

int64_t OptimizerStateBytes(const torch::optim::Optimizer& optimizer) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  auto add = [&](const torch::Tensor& t) {
    if (!t.defined() || !seen.insert(t.storage().unsafeGetStorageImpl()).second) return;
    bytes += static_cast<int64_t>(t.storage().nbytes());
  };
  for (const auto& [key, state] : optimizer.state()) {
    if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(state.get())) {
      add(s->exp_avg());
      add(s->exp_avg_sq());
      add(s->max_exp_avg_sq());
    } else if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(state.get())) {
      add(s->momentum_buffer());
    }
  }
  return bytes;
}

double LearningRateAt(const LrScheduleConfig& s, double base_lr, int64_t step) {
  if (s.name != "warmup_cosine") return base_lr;
  if (step < s.warmup_steps) {
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) /
                                            static_cast<double>(s.total_steps - s.warmup_steps));
  return s.min_lr + 0.5 * (base_lr - s.min_lr) * (1.0 + std::cos(M_PI * progress));
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace pp
