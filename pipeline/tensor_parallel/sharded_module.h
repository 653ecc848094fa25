// How a module says which of its parameters are shards of a tensor-parallel
// whole, and along which dimension: what gradient-norm clipping (count a shard
// once per rank, a replicated parameter once), checkpoints (one file per
// model-parallel rank, merged or split when tp changes) and Hugging Face
// export (merge the shards) need to know. Megatron keeps this as attributes
// on the parameter (`tensor_model_parallel`, `partition_dim`); a LibTorch
// tensor has none, so the module that owns the parameter answers instead.
//
// Next: pipeline/tensor_parallel/linear.h (modules that implement it).
#ifndef PIPELINE_TENSOR_PARALLEL_SHARDED_MODULE_H_
#define PIPELINE_TENSOR_PARALLEL_SHARDED_MODULE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace pp {
namespace tensor_parallel {

// How a parameter is split: along `dim`, the whole is `blocks` equal blocks
// (a fused q/k/v projection: 3) and rank r holds slice r of every block, in
// block order. blocks == 1 is a plain split. With `replicas` > 1 the whole
// splits into only tp / replicas slices and each is held by that many
// neighbouring ranks: rank r holds slice r / replicas (LLaMA's kv heads when
// tp exceeds their number). Those ranks' gradients are summed, so their
// copies stay equal; the norm and checkpoints count the first of them.
struct ShardSpec {
  int64_t dim = 0;
  int64_t blocks = 1;
  int64_t replicas = 1;
  bool operator==(const ShardSpec& other) const {
    return dim == other.dim && blocks == other.blocks && replicas == other.replicas;
  }
};

// Implemented (as a second base) by modules that hold shards.
class ShardedModule {
 public:
  virtual ~ShardedModule() = default;
  // Parameter name (as the module registers it) -> how tensor-parallel rank r
  // holds its slice of the whole. Parameters not listed are replicated: every
  // rank holds all of it. Empty for a dense module (a group of size 1).
  virtual std::map<std::string, ShardSpec> ShardDims() const = 0;
};

// Every sharded parameter under `root`, by its name in root.named_parameters()
// ("fc1.weight" -> {0, 1}), found by walking root's submodules.
std::map<std::string, ShardSpec> CollectShardDims(const torch::nn::Module& root);

// This rank's slice (`rank` of `parts` ranks) of `whole` under `spec`, and
// the whole put back together from every rank's slice, in rank order
// (checkpoints, Hugging Face export). REQUIRES: parts divides by replicas and
// the dimension by blocks * parts / replicas.
torch::Tensor ShardOf(const torch::Tensor& whole, const ShardSpec& spec, int64_t rank,
                      int64_t parts);
torch::Tensor MergeShards(const std::vector<torch::Tensor>& shards, const ShardSpec& spec);

}  // namespace tensor_parallel
}  // namespace pp

#endif  // PIPELINE_TENSOR_PARALLEL_SHARDED_MODULE_H_
