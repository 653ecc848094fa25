#include "pipeline/runtime/mixed_precision.h"

#include <glog/logging.h>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/torch_compat.h"

namespace pp {

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "fp32" || lower == "float32") return Precision::kFp32;
  if (lower == "bf16" || lower == "bfloat16") return Precision::kBf16;
  if (lower == "fp16" || lower == "float16" || lower == "half") {
    return absl::InvalidArgumentError(absl::StrCat(
        "precision '", name,
        "' is not supported: fp16 needs dynamic loss scaling, which pipe does not implement; "
        "use bf16 (same exponent range as fp32, no loss scaling) or fp32"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("precision '", name, "' is unknown; valid: fp32, bf16"));
}

const char* PrecisionName(Precision precision) {
  return precision == Precision::kBf16 ? "bf16" : "fp32";
}

absl::Status CheckBf16Support(const c10::Device& device) {
  std::string error;
  try {
    torch::Tensor a =
        torch::ones({4, 4}, torch::dtype(torch::kBFloat16).device(device)).requires_grad_(true);
    torch::Tensor b = torch::ones({4, 4}, torch::dtype(torch::kBFloat16).device(device));
    torch::Tensor y = torch::matmul(a, b).to(torch::kFloat).sum();
    y.backward();
    if (a.grad().scalar_type() == torch::kBFloat16 &&
        a.grad().to(torch::kFloat).sum().item<float>() == 64.0f) {
      return absl::OkStatus();
    }
    error = "the probe's bf16 gradient came back wrong";
  } catch (const std::exception& e) {
    error = e.what();
    error = error.substr(0, error.find('\n'));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "precision bf16 is not available on device ", device.str(), " with this binary's LibTorch ",
      torch_compat::LibTorchVersion(), " (", error, "); use precision fp32 (--precision=fp32)"));
}

torch::ScalarType ComputeDtype(Precision precision) {
  return precision == Precision::kBf16 ? torch::kBFloat16 : torch::kFloat;
}

Activations CastFloating(const Activations& tensors, torch::ScalarType dtype) {
  Activations out;
  out.reserve(tensors.size());
  for (const torch::Tensor& t : tensors) {
    out.push_back(t.defined() && t.is_floating_point() && t.scalar_type() != dtype ? t.to(dtype)
                                                                                   : t);
  }
  return out;
}

MasterWeights::MasterWeights(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& p : params) {
    if (!index_.emplace(p.unsafeGetTensorImpl(), params_.size()).second) continue;
    torch::Tensor master = p.detach().to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
    master.set_requires_grad(p.requires_grad());
    params_.push_back(p);
    masters_.push_back(master);
    // set_data keeps the Parameter object (modules, tie lists and autograd's
    // leaf identity) and changes only its storage and dtype.
    torch::Tensor param = p;
    param.set_data(p.detach().to(torch::kBFloat16));
  }
}

const torch::Tensor& MasterWeights::MasterOf(const torch::Tensor& param) const {
  auto it = index_.find(param.unsafeGetTensorImpl());
  return it == index_.end() ? param : masters_[it->second];
}

std::vector<torch::Tensor> MasterWeights::MastersOf(
    const std::vector<torch::Tensor>& params) const {
  std::vector<torch::Tensor> out;
  out.reserve(params.size());
  for (const torch::Tensor& p : params) out.push_back(MasterOf(p));
  return out;
}

void MasterWeights::AccumulateGrads() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& grad = params_[i].mutable_grad();
    if (!grad.defined()) continue;
    torch::Tensor& master_grad = masters_[i].mutable_grad();
    if (master_grad.defined()) {
      master_grad.add_(grad.to(torch::kFloat));
    } else {
      master_grad = grad.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
    }
    grad.reset();
  }
}

void MasterWeights::ReleaseValues() {
  torch::NoGradGuard no_grad;
  for (torch::Tensor& master : masters_) {
    // One element expanded to the shape: sizes stay (gradient code reads
    // them), writes fail loudly (overlapping memory).
    master.set_data(torch::zeros({}, master.options().requires_grad(false)).expand(master.sizes()));
  }
  released_ = true;
}

void MasterWeights::CopyToModel() {
  CHECK(!released_) << "MasterWeights::CopyToModel after ReleaseValues";
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(masters_[i]);
}

}  // namespace pp
