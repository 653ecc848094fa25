#include "pipeline/tensor_parallel/sequence_parallel_grads.h"

#include "pipeline/tensor_parallel/mappings.h"
#include "pipeline/tensor_parallel/planted_fault.h"

namespace pp {
namespace tensor_parallel {

void SequenceParallelGrads::Record(const torch::Tensor& param) {
  std::lock_guard<std::mutex> lock(mu_);
  recorded_.emplace(param.unsafeGetTensorImpl(), param);
}

std::vector<torch::Tensor> SequenceParallelGrads::Recorded(
    const std::vector<torch::Tensor>& params) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<torch::Tensor> found;
  for (const torch::Tensor& p : params) {
    if (recorded_.count(p.unsafeGetTensorImpl()) > 0) found.push_back(p);
  }
  return found;
}

void SequenceParallelGrads::SumGrads(const std::vector<torch::Tensor>& holders,
                                     const ModelParallelGroup& group) {
  if (holders.empty() || !group.is_parallel()) return;
  const internal::PlantedFault fault = internal::CurrentFault();
  if (fault == internal::PlantedFault::kSkipSequenceParallelGradSum) return;
  torch::NoGradGuard no_grad;
  c10::ScalarType dtype = holders.front().scalar_type();
  for (const torch::Tensor& h : holders) dtype = c10::promoteTypes(dtype, h.scalar_type());
  std::vector<torch::Tensor> flat_parts;
  flat_parts.reserve(holders.size());
  for (const torch::Tensor& h : holders) {
    torch::Tensor& grad = h.mutable_grad();
    if (!grad.defined()) grad = torch::zeros_like(h);
    flat_parts.push_back(grad.reshape({-1}).to(dtype));
  }
  torch::Tensor flat = torch::cat(flat_parts);
  AllReduceInPlace(flat, group, ReduceOp::kSum,
                   "the sequence-parallel replicated parameters' gradients");
  ++reductions_;
  int64_t offset = 0;
  for (size_t i = 0; i < holders.size(); ++i) {
    torch::Tensor& grad = holders[i].mutable_grad();
    // Planted: only the first parameter's sum is kept.
    if (fault == internal::PlantedFault::kSumOneSequenceParallelGrad && i > 0) break;
    const int64_t n = grad.numel();
    grad.copy_(flat.narrow(0, offset, n).view(grad.sizes()));
    offset += n;
  }
}

}  // namespace tensor_parallel
}  // namespace pp
