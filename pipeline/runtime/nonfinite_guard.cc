#include "pipeline/runtime/nonfinite_guard.h"

#include <cmath>
#include <vector>

#include <glog/logging.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "topology/wait_work.h"

namespace pp {
namespace {

// Fixed-size record each rank contributes to the all-gather: stage, data id,
// name length, then the name's bytes (truncated).
constexpr int64_t kNameBytes = 160;
constexpr int64_t kRecord = 3 + kNameBytes;

bool AllFinite(const torch::Tensor& t) { return t.isfinite().all().item<bool>(); }

std::string Describe(double value) { return std::isnan(value) ? "NaN" : absl::StrCat(value); }

}  // namespace

std::string FirstNonFiniteTensor(const PipelineModel& model, bool weights_only) {
  torch::NoGradGuard no_grad;
  const auto params = model.named_parameters();
  for (const auto& item : params) {
    if (weights_only) break;
    const torch::Tensor& grad = item.value().grad();
    if (grad.defined() && !AllFinite(grad)) return absl::StrCat(item.key(), " (gradient)");
  }
  for (const auto& item : params) {
    if (!AllFinite(item.value())) return absl::StrCat(item.key(), " (weight)");
  }
  return "";
}

namespace {

// "first at stage S (rank R, data-parallel id D): <tensor>" for the lowest
// stage where FirstNonFiniteTensor finds one (one all-gather on the world
// group), or "" when every rank's tensors are finite.
absl::StatusOr<std::string> Locate(const ParallelGrid& grid, const PipelineModel& model,
                                   bool weights_only, std::chrono::milliseconds timeout) {
  std::string mine;
  PP_RETURN_IF_ERROR(TorchCall("looking for non-finite tensors",
                               [&] { mine = FirstNonFiniteTensor(model, weights_only); }));
  if (static_cast<int64_t>(mine.size()) > kNameBytes) mine.resize(kNameBytes);
  torch::Tensor record = torch::zeros({kRecord}, torch::kLong);
  record[0] = grid.stage_id();
  record[1] = grid.data_parallel_id();
  record[2] = static_cast<int64_t>(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    record[3 + static_cast<int64_t>(i)] = static_cast<unsigned char>(mine[i]);
  }
  const int world = grid.world_size();
  std::vector<std::vector<at::Tensor>> gathered(1);
  for (int r = 0; r < world; ++r) gathered[0].push_back(torch::empty({kRecord}, torch::kLong));
  std::vector<at::Tensor> input = {record};
  if (world > 1) {
    PP_RETURN_IF_ERROR(
        RunCollective("non-finite report all-gather", grid.DescribeWorldGroup(), timeout,
                      [&] { return grid.world_group()->allgather(gathered, input); }));
  } else {
    gathered[0][0] = record;
  }
  int best_rank = -1;
  int64_t best_stage = 0;
  std::string best_name;
  for (int r = 0; r < world; ++r) {
    const torch::Tensor got = gathered[0][r];
    const int64_t stage = got[0].item<int64_t>();
    const int64_t length = got[2].item<int64_t>();
    if (length <= 0) continue;
    if (best_rank >= 0 && stage >= best_stage) continue;
    best_rank = r;
    best_stage = stage;
    best_name.clear();
    for (int64_t i = 0; i < length && i < kNameBytes; ++i) {
      best_name.push_back(static_cast<char>(got[3 + i].item<int64_t>()));
    }
  }
  if (best_rank < 0) return std::string();
  const int64_t data_id = gathered[0][best_rank][1].item<int64_t>();
  return absl::StrCat("first at stage ", best_stage, " (rank ", best_rank, ", data-parallel id ",
                      data_id, "): ", best_name);
}

}  // namespace

absl::Status CheckWeightsFinite(const ParallelGrid& grid, const PipelineModel& model, int64_t step,
                                std::chrono::milliseconds timeout) {
  PP_ASSIGN_OR_RETURN(std::string where, Locate(grid, model, /*weights_only=*/true, timeout));
  if (where.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the weights after step ", step, " are not finite (", where,
      "); not saving that checkpoint. Lower optimizer.lr or clip with optimizer.max_grad_norm"));
}

absl::Status NonFiniteGuard::AfterStep(const StepResult& result, const ParallelGrid& grid,
                                       const PipelineModel& model,
                                       std::chrono::milliseconds timeout) {
  const bool loss_ok = std::isfinite(result.loss);
  const bool norm_ok = std::isfinite(result.grad_norm);
  if (loss_ok && norm_ok) {
    skipped_in_a_row_ = 0;
    return absl::OkStatus();
  }
  const int64_t step = result.step + 1;  // as the progress line counts
  PP_ASSIGN_OR_RETURN(std::string where, Locate(grid, model, /*weights_only=*/false, timeout));
  if (where.empty()) where = "every gradient and weight is still finite";
  const std::string what = absl::StrCat(
      "step ", step, ": ", loss_ok ? "" : "loss ", loss_ok ? "" : Describe(result.loss),
      !loss_ok && !norm_ok ? ", " : "", norm_ok ? "" : "gradient norm ",
      norm_ok ? "" : Describe(result.grad_norm), " is not finite; ", where);
  if (options_.skip && result.update_skipped) {
    ++skipped_;
    ++skipped_in_a_row_;
    if (grid.global_rank() == 0) {
      LOG(WARNING) << what << "; update skipped (nonfinite.policy=skip, " << skipped_in_a_row_
                   << " in a row, " << skipped_ << " in all)";
    }
    if (skipped_in_a_row_ < options_.max_skipped_steps) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(what, "; ", skipped_in_a_row_,
                     " steps in a row had no finite gradient (nonfinite.max_skipped_steps = ",
                     options_.max_skipped_steps,
                     "): training has diverged (lower optimizer.lr "
                     "or clip with optimizer.max_grad_norm)"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what, options_.skip ? "; the update was applied (the gradient norm was finite)" : "",
      ". Stopped before saving (nonfinite.policy=", options_.skip ? "skip" : "fail",
      "); lower optimizer.lr, clip with optimizer.max_grad_norm, or set nonfinite.policy=skip"));
}

}  // namespace pp
