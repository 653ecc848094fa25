// Megatron's column- and row-parallel linear layers.
//
// A transformer's MLP (or attention) is a column-parallel linear followed by a
// row-parallel one: the first splits its output features over the
// tensor-parallel group (each rank computes out/tp columns of the same input),
// the second splits its input features (each rank multiplies its slice and the
// partial products are summed). Between them nothing is communicated; before
// the first, the input's gradient is all-reduced; after the second, the output
// is all-reduced (mappings.h). With sequence parallelism the input arrives
// sharded along the sequence and is all-gathered first, and the output is
// reduce-scattered back to sequence shards.
//
// Both are built by drawing the whole dense torch::nn::Linear from the RNG the
// layer factory is given and keeping this rank's slice, so the tp shards of a
// layer are exactly the slices of the layer ToSequential() builds (Megatron's
// CPU initialisation path): weights never depend on tp. Parameters keep
// Linear's names ("weight", "bias"); ShardDims says which are slices.
//
//   ColumnParallelLinear fc1(ParallelLinearOptions(width, 4 * width), ctx.model_parallel);
//   RowParallelLinear fc2(ParallelLinearOptions(4 * width, width), ctx.model_parallel);
//   y = fc2(torch::gelu(fc1(x)));   // x, y: [batch, seq (/ tp under SP), width]
//
// Not thread-safe (like any torch::nn::Module).
#ifndef PIPELINE_TENSOR_PARALLEL_LINEAR_H_
#define PIPELINE_TENSOR_PARALLEL_LINEAR_H_

#include <cstdint>
#include <map>
#include <string>

#include <torch/torch.h>

#include "pipeline/layers/layer_context.h"
#include "pipeline/tensor_parallel/sharded_module.h"

namespace pp {
namespace tensor_parallel {

struct ParallelLinearOptions {
  ParallelLinearOptions(int64_t in, int64_t out) : in_features(in), out_features(out) {}
  int64_t in_features;
  int64_t out_features;
  bool bias = true;
  // Column-parallel: all-gather the output columns so every rank has all of
  // them (the output leaves the tensor-parallel region).
  bool gather_output = false;
  // Row-parallel: the input is already this rank's slice of the features
  // (the output of a column-parallel layer); else it is scattered here.
  bool input_is_parallel = true;
  // The sequence dimension of activations ([batch, seq, features]: 1), used
  // under sequence parallelism.
  int64_t sequence_dim = 1;
  // Column-parallel: the output features are this many equal blocks (a fused
  // q/k/v projection: 3), and each rank holds its slice of every block, so
  // that rank r's outputs are its heads' q, k and v.
  int64_t output_blocks = 1;
  // Column-parallel: this many neighbouring ranks hold the same slice of the
  // output features, so the layer splits into tp / replicas slices (LLaMA's
  // k and v projections when tp exceeds the kv heads: each rank holds the kv
  // head of its query heads). Their weight gradients are summed
  // (CopyToReplicaGroup).
  int64_t replicas = 1;

  ParallelLinearOptions& Bias(bool b) {
    bias = b;
    return *this;
  }
  ParallelLinearOptions& GatherOutput(bool g) {
    gather_output = g;
    return *this;
  }
  ParallelLinearOptions& InputIsParallel(bool p) {
    input_is_parallel = p;
    return *this;
  }
  ParallelLinearOptions& OutputBlocks(int64_t b) {
    output_blocks = b;
    return *this;
  }
  ParallelLinearOptions& Replicas(int64_t r) {
    replicas = r;
    return *this;
  }
};

// Y = X A^T + b with A split by rows (output features) across the group.
// REQUIRES (checked at construction): replicas divides tp and out_features %
// (output_blocks * tp / replicas) == 0.
class ColumnParallelLinearImpl : public torch::nn::Module, public ShardedModule {
 public:
  ColumnParallelLinearImpl(const ParallelLinearOptions& options, ModelParallelGroup group);
  torch::Tensor forward(const torch::Tensor& x);
  std::map<std::string, ShardSpec> ShardDims() const override;

  const ParallelLinearOptions& options() const { return options_; }
  const ModelParallelGroup& group() const { return group_; }
  torch::Tensor weight;  // [out * replicas / tp, in]
  torch::Tensor bias;    // [out * replicas / tp], undefined without bias

 private:
  ShardSpec Spec() const;

  ParallelLinearOptions options_;
  ModelParallelGroup group_;
};
TORCH_MODULE(ColumnParallelLinear);

// Y = X A^T + b with A split by columns (input features) across the group;
// the bias is whole on every rank and added after the reduction.
// REQUIRES (checked at construction): in_features % tp == 0.
class RowParallelLinearImpl : public torch::nn::Module, public ShardedModule {
 public:
  RowParallelLinearImpl(const ParallelLinearOptions& options, ModelParallelGroup group);
  torch::Tensor forward(const torch::Tensor& x);
  std::map<std::string, ShardSpec> ShardDims() const override;

  const ParallelLinearOptions& options() const { return options_; }
  const ModelParallelGroup& group() const { return group_; }
  torch::Tensor weight;  // [out, in / tp]
  torch::Tensor bias;    // [out], replicated

 private:
  ParallelLinearOptions options_;
  ModelParallelGroup group_;
};
TORCH_MODULE(RowParallelLinear);

// A replicated parameter used on sequence shards (a norm's weight, a
// row-parallel bias, a position table under sequence parallelism): forward is
// the parameter, and its gradient, this rank's sequence slice's part, is
// summed over the group so that every rank holds the whole sequence's. Under
// the Trainer (group.sequence_parallel_grads armed) the parameter is recorded
// there and returned as is: the parts accumulate over the step's
// micro-batches and the Trainer sums them once per step, one flat all-reduce
// for all of them (sequence_parallel_grads.h, Megatron-core's
// finalize_model_grads). Otherwise (not armed) each backward sums its part
// (CopyToTensorParallelRegion). The identity without sequence parallelism.
torch::Tensor SequenceParallelReplicated(const torch::Tensor& param,
                                         const ModelParallelGroup& group);

}  // namespace tensor_parallel
}  // namespace pp

#endif  // PIPELINE_TENSOR_PARALLEL_LINEAR_H_
