#include "pipeline/tensor_parallel/linear.h"

#include <utility>

#include "pipeline/tensor_parallel/mappings.h"
#include "pipeline/tensor_parallel/sequence_parallel_grads.h"

namespace pp {
namespace tensor_parallel {
namespace {

// The dense layer's weight and bias, drawn from the current RNG exactly as
// torch::nn::Linear draws them.
torch::nn::Linear DenseLinear(const ParallelLinearOptions& options) {
  return torch::nn::Linear(
      torch::nn::LinearOptions(options.in_features, options.out_features).bias(options.bias));
}

void CheckDivides(int64_t features, const char* which, const ModelParallelGroup& group) {
  TORCH_CHECK(features % group.size == 0, which, " (", features,
              ") must be a multiple of the tensor-parallel size ", group.size,
              " to split a linear layer across ", DescribeModelParallel(group));
}

}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const ParallelLinearOptions& options,
                                                   ModelParallelGroup group)
    : options_(options), group_(std::move(group)) {
  TORCH_CHECK(options.replicas > 0 && group_.size % options.replicas == 0,
              "a column-parallel layer's replicas (", options.replicas,
              ") must divide the tensor-parallel size ", group_.size);
  TORCH_CHECK(options.replicas == 1 || !options.gather_output,
              "a column-parallel layer with replicated slices cannot gather its output");
  const int64_t slices = group_.size / options.replicas;
  TORCH_CHECK(
      options.output_blocks > 0 && options.out_features % (options.output_blocks * slices) == 0,
      "a column-parallel layer's out_features (", options.out_features, ") must be a multiple of ",
      slices == group_.size ? "the tensor-parallel size " : "the number of slices ", slices,
      options.output_blocks > 1 ? " times its output blocks " : "",
      options.output_blocks > 1 ? std::to_string(options.output_blocks) : "",
      " to split a linear layer across ", DescribeModelParallel(group_));
  torch::nn::Linear dense = DenseLinear(options);
  torch::NoGradGuard no_grad;
  const ShardSpec spec = Spec();
  weight = register_parameter(
      "weight", ShardOf(dense->weight, spec, group_.rank, group_.size).contiguous().clone());
  if (options.bias) {
    bias = register_parameter(
        "bias", ShardOf(dense->bias, spec, group_.rank, group_.size).contiguous().clone());
  }
}

ShardSpec ColumnParallelLinearImpl::Spec() const {
  return ShardSpec{0, options_.output_blocks, options_.replicas};
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  const torch::Tensor input =
      group_.sequence_parallel ? GatherFromSequenceParallelRegion(x, group_, options_.sequence_dim)
                               : CopyToTensorParallelRegion(x, group_);
  const torch::Tensor b =
      bias.defined() ? CopyToReplicaGroup(bias, group_, options_.replicas) : bias;
  torch::Tensor y = torch::linear(input, CopyToReplicaGroup(weight, group_, options_.replicas), b);
  return options_.gather_output ? GatherFromTensorParallelRegion(y, group_) : y;
}

std::map<std::string, ShardSpec> ColumnParallelLinearImpl::ShardDims() const {
  if (!group_.is_parallel()) return {};
  std::map<std::string, ShardSpec> dims = {{"weight", Spec()}};
  if (bias.defined()) dims["bias"] = Spec();
  return dims;
}

RowParallelLinearImpl::RowParallelLinearImpl(const ParallelLinearOptions& options,
                                             ModelParallelGroup group)
    : options_(options), group_(std::move(group)) {
  CheckDivides(options.in_features, "a row-parallel layer's in_features", group_);
  torch::nn::Linear dense = DenseLinear(options);
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", LocalSlice(dense->weight, group_, 1, "weight").clone());
  if (options.bias) bias = register_parameter("bias", dense->bias.clone());
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  // Dense: exactly torch::nn::Linear (one addmm with the bias).
  if (!group_.is_parallel()) return torch::linear(x, weight, bias);
  const torch::Tensor input =
      options_.input_is_parallel ? x : ScatterToTensorParallelRegion(x, group_);
  const torch::Tensor partial = torch::linear(input, weight);
  torch::Tensor y = group_.sequence_parallel ? ReduceScatterToSequenceParallelRegion(
                                                   partial, group_, options_.sequence_dim)
                                             : ReduceFromTensorParallelRegion(partial, group_);
  if (bias.defined()) y = y + SequenceParallelReplicated(bias, group_);
  return y;
}

std::map<std::string, ShardSpec> RowParallelLinearImpl::ShardDims() const {
  if (!group_.is_parallel()) return {};
  return {{"weight", ShardSpec{1, 1}}};
}

torch::Tensor SequenceParallelReplicated(const torch::Tensor& param,
                                         const ModelParallelGroup& group) {
  if (!group.sequence_parallel) return param;
  SequenceParallelGrads* deferred = group.sequence_parallel_grads.get();
  if (deferred == nullptr || !deferred->deferred()) return CopyToTensorParallelRegion(param, group);
  if (param.requires_grad() && torch::GradMode::is_enabled()) deferred->Record(param);
  return param;
}

}  // namespace tensor_parallel
}  // namespace pp
