// Optimizer and learning-rate schedule wiring for the Trainer (and for the
// sequential reference loops that tests compare it with).
#ifndef PIPELINE_RUNTIME_OPTIMIZER_H_
#define PIPELINE_RUNTIME_OPTIMIZER_H_

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"

namespace pp {

struct OptimizerConfig {
  std::string name = "sgd";  // "sgd" (with momentum) or "adamw"
  double lr = 0.1;
  double momentum = 0.0;      // sgd
  double weight_decay = 0.0;  // sgd and adamw
  double beta1 = 0.9;         // adamw
  double beta2 = 0.999;       // adamw
  double eps = 1e-8;          // adamw
};

// Learning rate as a function of the step: constant, or linear warm-up from 0
// to the base rate over `warmup_steps`, then cosine decay to `min_lr` at
// `total_steps`.
struct LrScheduleConfig {
  std::string name = "constant";  // "constant" or "warmup_cosine"
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double min_lr = 0.0;
};

// InvalidArgument for an unknown name or bad values (named).
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);
absl::Status ValidateLrSchedule(const LrScheduleConfig& config);

// A torch::optim optimizer over `params` (empty is fine: a stage may have no
// parameters). REQUIRES: ValidateOptimizerConfig(config).ok().
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const OptimizerConfig& config,
                                                       std::vector<torch::Tensor> params);

// Bytes of the state tensors `optimizer` holds (AdamW's moments, SGD's
// momentum buffers; each storage once), from their storage: measured, not
// derived from the parameter count.
int64_t OptimizerStateBytes(const torch::optim::Optimizer& optimizer);

// The rate for 0-based `step`.
double LearningRateAt(const LrScheduleConfig& schedule, double base_lr, int64_t step);

// Sets every param group's learning rate.
void SetLearningRate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace pp

#endif  // PIPELINE_RUNTIME_OPTIMIZER_H_
