#include "pipeline/tensor_parallel/sharded_module.h"

#include <memory>

namespace pp {
namespace tensor_parallel {

std::map<std::string, ShardSpec> CollectShardDims(const torch::nn::Module& root) {
  std::map<std::string, ShardSpec> dims;
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const auto* sharded = dynamic_cast<const ShardedModule*>(item.value().get());
    if (sharded == nullptr) continue;
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& [name, dim] : sharded->ShardDims()) dims[prefix + name] = dim;
  }
  return dims;
}

torch::Tensor ShardOf(const torch::Tensor& whole, const ShardSpec& spec, int64_t rank,
                      int64_t parts) {
  const int64_t dim = spec.dim < 0 ? spec.dim + whole.dim() : spec.dim;
  const int64_t size = whole.size(dim);
  TORCH_CHECK(
      parts > 0 && rank >= 0 && rank < parts && spec.replicas > 0 && parts % spec.replicas == 0,
      "tensor-parallel rank ", rank, " of ", parts, " ranks cannot hold a slice held by ",
      spec.replicas, " ranks each");
  const int64_t slices = parts / spec.replicas;
  TORCH_CHECK(size % (spec.blocks * slices) == 0, "dimension ", dim, " of a tensor of shape ",
              whole.sizes(), " (", size, ") must split into ", spec.blocks, " block(s) of ", slices,
              " tensor-parallel slices");
  const int64_t block = size / spec.blocks;
  const int64_t part = block / slices;
  const int64_t slice = rank / spec.replicas;
  std::vector<torch::Tensor> pieces;
  for (int64_t b = 0; b < spec.blocks; ++b) {
    pieces.push_back(whole.narrow(dim, b * block + slice * part, part));
  }
  return spec.blocks == 1 ? pieces[0] : torch::cat(pieces, dim);
}

torch::Tensor MergeShards(const std::vector<torch::Tensor>& shards, const ShardSpec& spec) {
  TORCH_CHECK(!shards.empty(), "MergeShards: no shards");
  const int64_t dim = spec.dim < 0 ? spec.dim + shards[0].dim() : spec.dim;
  const int64_t size = shards[0].size(dim);
  TORCH_CHECK(size % spec.blocks == 0, "MergeShards: a shard's dimension ", dim, " (", size,
              ") does not split into ", spec.blocks, " blocks");
  const int64_t part = size / spec.blocks;
  TORCH_CHECK(spec.replicas > 0 && shards.size() % spec.replicas == 0,
              "MergeShards: ", shards.size(), " shards are not groups of ", spec.replicas,
              " replicas");
  std::vector<torch::Tensor> pieces;
  for (int64_t b = 0; b < spec.blocks; ++b) {
    // The first of each group of replicas (they are equal).
    for (size_t s = 0; s < shards.size(); s += spec.replicas) {
      pieces.push_back(shards[s].narrow(dim, b * part, part));
    }
  }
  return torch::cat(pieces, dim);
}

}  // namespace tensor_parallel
}  // namespace pp
