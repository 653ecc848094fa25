// What a layer factory learns about the place its layer is built for.
//
// A factory receives a LayerContext: the layer's global index in the spec list,
// the model-parallel (tensor-parallel) group it is a shard of, the device and
// parameter dtype it will train in, and the seed its RNG was given. Layers read
// their shard from here, never from globals (Megatron-core's config object,
// PyTorch's DeviceMesh), so one spec list builds a dense layer for
// ToSequential() and the tp-th shard of it on a tensor-parallel rank.
//
//   pp::LayerSpec("Block", [config](const pp::LayerContext& ctx) {
//     return std::make_shared<Block>(config, ctx.model_parallel);
//   });
//
// Next: pipeline/layers/layer_spec.h (the spec list that holds the factories).
#ifndef PIPELINE_LAYERS_LAYER_CONTEXT_H_
#define PIPELINE_LAYERS_LAYER_CONTEXT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace pp {
namespace tensor_parallel {
class SequenceParallelGrads;  // pipeline/tensor_parallel/sequence_parallel_grads.h
}  // namespace tensor_parallel

// The tensor-parallel slot of a layer: rank `rank` of `size` peers that hold one
// shard each and communicate through `group` (the grid's model axis). size == 1
// is a dense layer; `group` is then null and no collective may be issued.
struct ModelParallelGroup {
  int64_t rank = 0;
  int64_t size = 1;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  // Megatron's sequence parallelism: activations outside tensor-parallel regions
  // are sharded along the sequence dimension.
  bool sequence_parallel = false;
  // Under sequence parallelism: where SequenceParallelReplicated records the
  // parameters whole on every rank but applied to its sequence shard, whose
  // gradients the runtime then sums over `group` once per step (the Trainer
  // arms it; ModelParallelGroupOf makes it). Shared by every copy of the
  // group. Null, or not armed: each backward sums them.
  std::shared_ptr<tensor_parallel::SequenceParallelGrads> sequence_parallel_grads;
  // Every collective on `group` waits at most this long, then throws naming
  // the collective and `description`.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // How errors name the group ("model group [2,3] (this rank's peers: ...)").
  std::string description = "model group";

  bool is_parallel() const { return size > 1; }
};

// Where a stage's layers are built for: the same for every layer of a stage.
struct LayerEnvironment {
  ModelParallelGroup model_parallel;
  // The device and dtype the parameters will train in. Factories build on the
  // CPU in fp32 (the runtime moves and casts, so initial weights do not depend
  // on the device); a layer may read these to choose kernels or buffers.
  torch::Device device = torch::kCPU;
  torch::Dtype param_dtype = torch::kFloat32;
};

// Everything a factory may depend on. Copyable; the group is shared.
struct LayerContext {
  // Index of the layer in the spec list; for a tied module, the index of its
  // key's first occurrence.
  int64_t global_index = 0;
  // The default CPU generator is seeded with this value while the factory runs
  // (torch::nn's own initialisers draw from it); `rng` is that generator, for
  // factories that draw explicitly (torch::randn(sizes, ctx.rng)).
  uint64_t seed = 0;
  at::Generator rng;
  ModelParallelGroup model_parallel;
  torch::Device device = torch::kCPU;
  torch::Dtype param_dtype = torch::kFloat32;
};

// The context of layer `global_index` built with `seed` in `environment`
// (`rng` is filled in by BuildSeeded when the factory runs).
LayerContext MakeLayerContext(const LayerEnvironment& environment, int64_t global_index,
                              uint64_t seed);

// The dense environment ToSequential() builds in: no model-parallel group,
// `environment`'s device and dtype.
LayerEnvironment DenseEnvironment(const LayerEnvironment& environment);

// "tp rank 1 of 2" / "dense", for error messages.
std::string DescribeModelParallel(const ModelParallelGroup& group);

}  // namespace pp

#endif  // PIPELINE_LAYERS_LAYER_CONTEXT_H_
