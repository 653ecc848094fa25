#include "pipeline/runtime/grad_sync.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "topology/wait_work.h"

namespace pp {
namespace {

// One flat buffer of all gradients (undefined ones as zeros).
torch::Tensor FlattenGrads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> flat;
  flat.reserve(params.size());
  for (const torch::Tensor& p : params) {
    if (p.grad().defined()) {
      flat.push_back(p.grad().detach().reshape({-1}));
    } else {
      flat.push_back(torch::zeros({p.numel()}, p.options()));
    }
  }
  return torch::cat(flat);
}

void UnflattenGrads(const std::vector<torch::Tensor>& params, const torch::Tensor& flat) {
  int64_t offset = 0;
  for (const torch::Tensor& p : params) {
    torch::Tensor slice = flat.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
    torch::Tensor& grad = const_cast<torch::Tensor&>(p).mutable_grad();
    if (grad.defined()) {
      grad.detach().copy_(slice);
    } else {
      grad = slice.clone();
    }
  }
}

}  // namespace

absl::Status BroadcastTiedParams(const std::vector<TiedParams>& ties,
                                 std::chrono::milliseconds timeout) {
  torch::NoGradGuard no_grad;
  for (const TiedParams& tie : ties) {
    if (!tie.group || tie.group->getSize() == 1) continue;
    for (size_t i = 0; i < tie.params.size(); ++i) {
      std::vector<at::Tensor> one = {tie.params[i].detach()};
      PP_RETURN_IF_ERROR(
          RunCollective(absl::StrCat("broadcast of tied weight '", tie.key, "' param ", i),
                        tie.members, timeout, [&] { return tie.group->broadcast(one); }));
    }
  }
  return absl::OkStatus();
}

absl::Status AllReduceTiedGrads(const std::vector<TiedParams>& ties,
                                std::chrono::milliseconds timeout) {
  torch::NoGradGuard no_grad;
  for (const TiedParams& tie : ties) {
    if (!tie.group || tie.group->getSize() == 1 || tie.params.empty()) continue;
    torch::Tensor flat;
    PP_RETURN_IF_ERROR(TorchCall("flatten tied grads", [&] { flat = FlattenGrads(tie.params); }));
    std::vector<at::Tensor> one = {flat};
    PP_RETURN_IF_ERROR(RunCollective(absl::StrCat("tied-grad all-reduce of '", tie.key, "'"),
                                     tie.members, timeout,
                                     [&] { return tie.group->allreduce(one); }));
    UnflattenGrads(tie.params, flat);
  }
  return absl::OkStatus();
}

absl::Status AverageGrads(const std::vector<torch::Tensor>& params,
                          const c10::intrusive_ptr<c10d::ProcessGroup>& data_group,
                          std::chrono::milliseconds timeout) {
  if (!data_group || data_group->getSize() == 1 || params.empty()) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  torch::Tensor flat;
  PP_RETURN_IF_ERROR(TorchCall("flatten grads", [&] { flat = FlattenGrads(params); }));
  std::vector<at::Tensor> one = {flat};
  PP_RETURN_IF_ERROR(RunCollective("data-parallel gradient all-reduce",
                                   absl::StrCat("data group of ", data_group->getSize(), " ranks"),
                                   timeout, [&] { return data_group->allreduce(one); }));
  flat.div_(static_cast<double>(data_group->getSize()));
  UnflattenGrads(params, flat);
  return absl::OkStatus();
}

namespace {

absl::StatusOr<double> ReduceSquaredNorm(double local,
                                         const c10::intrusive_ptr<c10d::ProcessGroup>& pipe_group,
                                         const c10::intrusive_ptr<c10d::ProcessGroup>& data_group,
                                         bool average_over_data, std::chrono::milliseconds timeout,
                                         torch::Device device) {
  torch::NoGradGuard no_grad;
  torch::Tensor sumsq = torch::tensor({local}, torch::kDouble).to(device);
  std::vector<at::Tensor> one = {sumsq};
  if (pipe_group && pipe_group->getSize() > 1) {
    PP_RETURN_IF_ERROR(RunCollective("grad-norm all-reduce", "pipe group", timeout,
                                     [&] { return pipe_group->allreduce(one); }));
  }
  if (data_group && data_group->getSize() > 1) {
    PP_RETURN_IF_ERROR(RunCollective("grad-norm all-reduce", "data group", timeout,
                                     [&] { return data_group->allreduce(one); }));
    if (average_over_data) sumsq.div_(static_cast<double>(data_group->getSize()));
  }
  return std::sqrt(sumsq.cpu().item<double>());
}

}  // namespace

absl::StatusOr<double> GlobalGradNorm(const std::vector<torch::Tensor>& counted_params,
                                      const c10::intrusive_ptr<c10d::ProcessGroup>& pipe_group,
                                      const c10::intrusive_ptr<c10d::ProcessGroup>& data_group,
                                      std::chrono::milliseconds timeout, torch::Device device) {
  torch::NoGradGuard no_grad;
  double local = 0.0;
  for (const torch::Tensor& p : counted_params) {
    if (!p.grad().defined()) continue;
    // Float norm per tensor (vectorised, no copy), squares summed in double.
    const double n = p.grad().detach().norm().item<double>();
    local += n * n;
  }
  return ReduceSquaredNorm(local, pipe_group, data_group, /*average_over_data=*/true, timeout,
                           device);
}

absl::StatusOr<double> ShardedGradNorm(double local_sum_of_squares,
                                       const c10::intrusive_ptr<c10d::ProcessGroup>& pipe_group,
                                       const c10::intrusive_ptr<c10d::ProcessGroup>& data_group,
                                       std::chrono::milliseconds timeout, torch::Device device) {
  return ReduceSquaredNorm(local_sum_of_squares, pipe_group, data_group,
                           /*average_over_data=*/false, timeout, device);
}

double ClipCoefficient(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

std::map<std::string, tensor_parallel::ShardSpec> ModelShardDims(const PipelineModel& model) {
  std::map<std::string, tensor_parallel::ShardSpec> dims;
  for (int64_t c = 0; c < model.num_chunks(); ++c) {
    // A chunk registers its layers under their global names, so these are
    // the names model.named_parameters() gives.
    dims.merge(tensor_parallel::CollectShardDims(*model.chunk(c)));
  }
  return dims;
}

void ClipGradsToNorm(const std::vector<torch::Tensor>& params, double norm, double max_norm) {
  const double coef = ClipCoefficient(norm, max_norm);
  if (coef >= 1.0) return;
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& p : params) {
    if (p.grad().defined()) p.grad().mul_(coef);
  }
}

}  // namespace pp
