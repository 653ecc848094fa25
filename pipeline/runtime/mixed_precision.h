// Mixed precision (Megatron-LM's recipe): bf16 parameters and activations for
// forward and backward, an fp32 master copy of every parameter that the
// optimizer owns (its states are fp32 too), gradients accumulated into fp32
// buffers after every backward pass (a micro-batch's B, I or W), reduced,
// norm-clipped and applied in fp32, and the master weights cast back to bf16
// after each optimizer step.
//
//   PP_ASSIGN_OR_RETURN(pp::Precision p, pp::ParsePrecision("bf16"));
//   pp::MasterWeights master(model->parameters());  // fp32 in; bf16 after
//   auto opt = pp::MakeOptimizer(config, master.masters());
//   ... backward of one micro-batch ...; master.AccumulateGrads();
//   opt->step(); master.CopyToModel();
//
// Why fp32 accumulation: m micro-batches summed in bf16 (8 significant bits)
// lose the small contributions once the sum is large; fp32 keeps 24 bits.
// The loss, LayerNorm/RMSNorm and attention softmax run in fp32 too (the
// models and the Trainer cast around them); see docs/runtime.md
// and docs/training.md "Mixed precision (bf16)" for the table of which op
// runs in which dtype.
#ifndef PIPELINE_RUNTIME_MIXED_PRECISION_H_
#define PIPELINE_RUNTIME_MIXED_PRECISION_H_

#include <string>
#include <unordered_map>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/layers/layer.h"

namespace pp {

enum class Precision { kFp32, kBf16 };

// "fp32" or "bf16". "fp16" (and "half") is refused saying why (it would need
// loss scaling, which pipe does not implement); anything else lists the valid
// names.
absl::StatusOr<Precision> ParsePrecision(absl::string_view name);
const char* PrecisionName(Precision precision);

// OK when `device` runs bf16 matrix products, forward and backward (a probe:
// a small bf16 matmul and its gradient). Else FailedPrecondition naming the
// device, this binary's LibTorch and what works (fp32).
absl::Status CheckBf16Support(const c10::Device& device);

// The dtype parameters and activations have under `precision`.
torch::ScalarType ComputeDtype(Precision precision);

// Floating-point tensors cast to `dtype` (integer tensors, e.g. token ids, as
// they are); a tensor already of `dtype` is returned as it is (no copy, so a
// received activation keeps its autograd identity).
Activations CastFloating(const Activations& tensors, torch::ScalarType dtype);

// The fp32 master copies of a set of parameters. Construction copies each
// parameter (fp32 and on its device, any dtype accepted) and then turns the
// parameter itself into bf16 in place (Tensor::set_data: the module, tied
// copies and the parameter's identity stay what they were). Parameters are
// matched by identity (TensorImpl), each listed once.
class MasterWeights {
 public:
  explicit MasterWeights(const std::vector<torch::Tensor>& params);

  // The master of `param` (a model parameter); `param` itself when it has
  // none (so callers can map any list).
  const torch::Tensor& MasterOf(const torch::Tensor& param) const;
  std::vector<torch::Tensor> MastersOf(const std::vector<torch::Tensor>& params) const;
  // Every master, in the order of the constructor's params.
  const std::vector<torch::Tensor>& masters() const { return masters_; }

  // Adds every model parameter's .grad (bf16) into its master's .grad (fp32;
  // created when undefined) and resets the model's .grad. Call after each
  // backward pass so nothing is summed in bf16 across micro-batches.
  void AccumulateGrads();
  // Casts the masters into the bf16 parameters (after an optimizer step or
  // after the masters were loaded from a checkpoint).
  void CopyToModel();

  // For a distributed optimizer that keeps its own fp32 slice of the masters
  // (distributed_optimizer.h): frees the masters' values and keeps only
  // their .grad (the fp32 gradient accumulators). The masters keep their
  // shapes but hold one zero element, expanded (a write into one fails);
  // CopyToModel must not be called any more (CHECK).
  void ReleaseValues();

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> masters_;
  std::unordered_map<const void*, size_t> index_;
  bool released_ = false;
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_MIXED_PRECISION_H_
