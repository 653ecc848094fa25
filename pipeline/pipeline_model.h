// One pipeline stage's share of a model, built from a LayerSpec list.
//
// PipelineModel partitions the list (a registered partitioner or explicit
// bounds) into num_stages * chunks parts and builds, for its stage, one
// StageModule per chunk (chunk c = virtual stage c * num_stages + stage).
// Parameter names are global and partition-independent: layer i's parameters
// are "layers.<i>.<name inside the layer>", a tied key's shared module's are
// "tied.<key>.<name>", so checkpoints and comparisons line up across partitions
// and with ToSequential().
//
//   pp::PipelineModelOptions opts;
//   opts.num_stages = 4; opts.partition_method = "type:Block";
//   ASSIGN_OR_RETURN(auto model, pp::PipelineModel::Create(specs, opts, grid.stage_id()));
//   pp::Activations y = model->chunk(0)->Forward(x, micro_batch);
//
// Next: pipeline/tie_analysis.h (tie groups found in an ordinary module).
#ifndef PIPELINE_PIPELINE_MODEL_H_
#define PIPELINE_PIPELINE_MODEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/partition/partitioner.h"

namespace pp {

// One chunk of one stage (or, from ToSequential, the whole model): an ordered
// run of consecutive layers with their global indices. Its submodules are
// "layers" (children named by global index) and "tied" (children named by
// key), so named_parameters() yields global names. Not thread-safe.
class StageModuleImpl : public torch::nn::Module {
 public:
  // Use PipelineModel / BuildSequential; public for torch::nn's holders.
  StageModuleImpl(int64_t virtual_stage, int64_t first_layer, std::vector<Layer> layers,
                  std::map<std::string, Layer> tied_modules);

  // Runs the local layers through the layer runner (RunLayers by default).
  Activations Forward(const Activations& inputs, const MicroBatch& batch);

  // Replaces how Forward runs the layers (activation checkpointing). An empty
  // runner restores RunLayers.
  void set_layer_runner(LayerRunner runner);
  const LayerRunner& layer_runner() const { return runner_; }

  // -1 for a ToSequential module.
  int64_t virtual_stage() const { return virtual_stage_; }
  // Global indices [first_layer(), end_layer()).
  int64_t first_layer() const { return first_layer_; }
  int64_t end_layer() const { return first_layer_ + static_cast<int64_t>(layers_.size()); }
  const std::vector<Layer>& layers() const { return layers_; }
  // Global index of local layer `local`.
  int64_t global_index(int64_t local) const { return first_layer_ + local; }
  // The shared modules this chunk uses, by tie key (the same objects as in the
  // stage's other chunks).
  const std::map<std::string, Layer>& tied_modules() const { return tied_; }

 private:
  int64_t virtual_stage_;
  int64_t first_layer_;
  std::vector<Layer> layers_;
  std::map<std::string, Layer> tied_;
  LayerRunner runner_;
};
TORCH_MODULE(StageModule);

// A tie key as seen by the whole model (the same on every stage).
struct TieGroup {
  std::string key;
  // Global positions using the key, ascending.
  std::vector<int64_t> layer_indices;
  // Stages (not virtual stages) holding a copy, ascending. A group with one
  // stage needs no communication.
  std::vector<int64_t> stages;
  // Global names of the tied parameters ("tied.<key>.weight"), in the shared
  // module's registration order.
  std::vector<std::string> param_names;
};

struct PipelineModelOptions {
  int64_t num_stages = 1;
  // Model chunks per stage (interleaving); partitions into num_stages * chunks parts.
  int64_t chunks = 1;
  // A registered partitioner ("uniform", "parameters", "type:Block", "profile",
  // "explicit:0,3,7"), used when `bounds` is empty.
  std::string partition_method = "parameters";
  // num_stages * chunks + 1 entries; overrides partition_method.
  Bounds bounds;
  // Virtual stage -> stage (the schedule's Schedule::stage_to_rank). Empty:
  // looped (virtual stage c * num_stages + s on stage s). Otherwise
  // num_stages * chunks entries, each stage holding exactly `chunks` of them,
  // e.g. V placement for zbv (pipeline/schedule/ir/schedule.h VPlacement). Chunk
  // c of a stage is the c-th of its virtual stages in ascending order.
  std::vector<int> stage_to_rank;
  // Layer i is built right after seeding with base_seed + i.
  uint64_t base_seed = 1234;
  // What every layer's factory is told about its tensor-parallel shard, device
  // and dtype (pipeline/layers/layer_context.h). Partitioning and the partition
  // report count the dense model, so every tensor-parallel rank cuts alike.
  LayerEnvironment layer_environment;
  // For "profile": see PartitionRequest.
  Activations sample_inputs;
  MicroBatch sample_batch;
  int profile_repeats = 5;
};

// One stage's modules and the model-wide partition and tie facts.
// Owns its StageModules; copies of the spec list. Not thread-safe.
class PipelineModel {
 public:
  // InvalidArgument for an empty/invalid spec list, num_stages < 1, chunks < 1,
  // stage outside [0, num_stages), an unknown partition method, bounds that do
  // not fit, fewer layers than parts, tied parameter names that do not exist.
  static absl::StatusOr<std::unique_ptr<PipelineModel>> Create(std::vector<LayerSpec> specs,
                                                               const PipelineModelOptions& options,
                                                               int64_t stage);

  int64_t stage() const { return stage_; }
  int64_t num_stages() const { return options_.num_stages; }
  int64_t num_chunks() const { return options_.chunks; }
  int64_t num_layers() const { return static_cast<int64_t>(specs_.size()); }
  const std::vector<LayerSpec>& specs() const { return specs_; }
  const PipelineModelOptions& options() const { return options_; }

  // All num_stages * chunks + 1 bounds, indexed by virtual stage.
  const Bounds& bounds() const { return bounds_; }
  // Virtual stage -> stage: options().stage_to_rank, or looped when empty.
  const std::vector<int>& placement() const { return placement_; }
  // Chunk c of this stage (chunk(c)->virtual_stage(): c * num_stages + stage
  // when looped). A holder
  // (shared pointer) by value, so callers can run it: model->chunk(0)->Forward(...).
  StageModule chunk(int64_t c) const { return chunks_.at(c); }
  // Iterate by value (`for (StageModule c : model->chunks())`) to call non-const methods.
  const std::vector<StageModule>& chunks() const { return chunks_; }
  // The stage that owns global layer `layer`, and the chunk within it.
  int64_t StageOfLayer(int64_t layer) const;
  int64_t ChunkOfLayer(int64_t layer) const;

  // This stage's parameters under global names, each tensor once (a tied module
  // used by two chunks appears once), ordered by chunk then registration.
  torch::OrderedDict<std::string, torch::Tensor> named_parameters() const;
  std::vector<torch::Tensor> parameters() const;
  // Chunk c's parameters under global names, each tensor once.
  torch::OrderedDict<std::string, torch::Tensor> chunk_named_parameters(int64_t c) const;
  // This stage's buffers under global names, each tensor once.
  torch::OrderedDict<std::string, torch::Tensor> named_buffers() const;

  // Every tie key of the model, sorted by key; identical on all stages.
  const std::vector<TieGroup>& tie_groups() const { return tie_groups_; }
  // The tie groups this stage holds a copy of.
  std::vector<TieGroup> LocalTieGroups() const;
  // This stage's copy of the tied parameters of `key` (global name -> tensor).
  // NotFound when this stage does not hold the key.
  absl::StatusOr<torch::OrderedDict<std::string, torch::Tensor>> TiedParameters(
      const std::string& key) const;
  // This stage's shared module for `key`, or nullptr.
  Layer TiedModule(const std::string& key) const;

  // Sets the runner of every chunk (activation checkpointing).
  void set_layer_runner(const LayerRunner& runner);
  void train(bool on = true);
  void eval() { train(false); }
  void to(torch::Device device);

  // All layers in one module with each tie key as one shared module, built with
  // the same seeds (so the same initial weights) and global names, running
  // through `runner` (default RunLayers). Its layers are dense (a context of
  // model-parallel size 1), whatever this stage's tensor-parallel shard.
  StageModule ToSequential(const LayerRunner& runner = nullptr) const;

  // DeepSpeed-style partition printout with trainable parameter counts (layers
  // without a declared count are built and freed one at a time to count them).
  std::string PartitionReport() const;

 private:
  PipelineModel() = default;
  // The part (virtual stage) that owns global layer `layer`.
  int64_t PartOfLayer(int64_t layer) const;

  std::vector<LayerSpec> specs_;
  PipelineModelOptions options_;
  int64_t stage_ = 0;
  std::vector<int> placement_;
  Bounds bounds_;
  std::vector<StageModule> chunks_;
  std::map<std::string, Layer> tied_;  // This stage's shared modules.
  std::vector<TieGroup> tie_groups_;
};

// Builds all of `specs` as one module (what PipelineModel::ToSequential does):
// layer i seeded with base_seed + i in `environment`, each tie key built once.
absl::StatusOr<StageModule> BuildSequential(const std::vector<LayerSpec>& specs, uint64_t base_seed,
                                            const LayerRunner& runner = nullptr,
                                            const LayerEnvironment& environment = {});

}  // namespace pp

#endif  // PIPELINE_PIPELINE_MODEL_H_
