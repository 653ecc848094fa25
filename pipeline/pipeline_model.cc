#include "pipeline/pipeline_model.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace pp {
namespace {

// Tensors are deduplicated by implementation: a tied module registered in two
// chunks (or a tensor registered under two names) is one parameter.
torch::OrderedDict<std::string, torch::Tensor> UniqueByTensor(
    const std::vector<torch::OrderedDict<std::string, torch::Tensor>>& lists) {
  torch::OrderedDict<std::string, torch::Tensor> out;
  std::unordered_set<const void*> seen;
  for (const auto& list : lists) {
    for (const auto& item : list) {
      if (!item.value().defined()) continue;
      if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
      if (out.contains(item.key())) continue;
      out.insert(item.key(), item.value());
    }
  }
  return out;
}

// Names inside the shared module of `key` whose values are kept identical
// across stages: the spec's list (checked against the module) or all of the
// module's parameters.
absl::StatusOr<std::vector<std::string>> TiedParamNames(const std::string& key,
                                                        const std::vector<std::string>& declared,
                                                        const LayerImpl& module) {
  const auto params = module.named_parameters();
  if (declared.empty()) return params.keys();
  for (const std::string& name : declared) {
    if (!params.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tie key '", key, "': tied parameter '", name,
          "' does not exist; the shared module has: ", absl::StrJoin(params.keys(), ", ")));
    }
  }
  return declared;
}

// Builds (or reuses from `tied`) the shared module of `key`: from the factory
// of the key's first occurrence, seeded with base_seed + that index, so every
// stage's copy starts identical.
Layer SharedModule(const std::vector<LayerSpec>& specs, const std::string& key, int64_t first,
                   uint64_t base_seed, const LayerEnvironment& environment,
                   std::map<std::string, Layer>* tied) {
  Layer& module = (*tied)[key];
  if (module == nullptr) module = BuildSpecLayer(specs[first], first, base_seed, environment);
  return module;
}

// Builds layers [begin, end) as one StageModule; shared modules come from (and
// go into) `tied`, which spans the stage.
absl::StatusOr<StageModule> BuildRange(
    const std::vector<LayerSpec>& specs, int64_t virtual_stage, int64_t begin, int64_t end,
    uint64_t base_seed, const LayerEnvironment& environment,
    const std::map<std::string, std::vector<int64_t>>& tie_positions,
    std::map<std::string, Layer>* tied) {
  std::vector<Layer> layers;
  std::map<std::string, Layer> chunk_tied;
  for (int64_t i = begin; i < end; ++i) {
    const LayerSpec& spec = specs[i];
    try {
      if (spec.is_tied()) {
        Layer shared = SharedModule(specs, spec.tie_key(), tie_positions.at(spec.tie_key()).front(),
                                    base_seed, environment, tied);
        chunk_tied[spec.tie_key()] = shared;
        layers.push_back(std::make_shared<TiedLayer>(spec.name(), spec.tie_key(), shared,
                                                     spec.tied_forward_fn()));
      } else {
        layers.push_back(BuildSpecLayer(spec, i, base_seed, environment));
      }
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("building layer ", i, " ('", spec.name(),
                                                     "') failed: ", ExceptionMessage(e)));
    }
  }
  return StageModule(virtual_stage, begin, std::move(layers), std::move(chunk_tied));
}

absl::Status CheckTieConsistency(const std::vector<LayerSpec>& specs,
                                 const std::map<std::string, std::vector<int64_t>>& tie_positions) {
  for (const auto& [key, positions] : tie_positions) {
    const auto& names = specs[positions.front()].tied_param_names();
    for (int64_t i : positions) {
      if (specs[i].tied_param_names() != names) {
        return absl::InvalidArgumentError(
            absl::StrCat("tie key '", key, "': layer ", i, " ties parameters [",
                         absl::StrJoin(specs[i].tied_param_names(), ","), "] but layer ",
                         positions.front(), " ties [", absl::StrJoin(names, ","),
                         "]; all positions of a key must tie the same parameters"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

StageModuleImpl::StageModuleImpl(int64_t virtual_stage, int64_t first_layer,
                                 std::vector<Layer> layers,
                                 std::map<std::string, Layer> tied_modules)
    : virtual_stage_(virtual_stage),
      first_layer_(first_layer),
      layers_(std::move(layers)),
      tied_(std::move(tied_modules)),
      runner_(&RunLayers) {
  auto layer_holder = register_module("layers", std::make_shared<torch::nn::Module>("Layers"));
  for (size_t i = 0; i < layers_.size(); ++i) {
    layer_holder->register_module(std::to_string(first_layer_ + static_cast<int64_t>(i)),
                                  layers_[i]);
  }
  if (!tied_.empty()) {
    auto tied_holder = register_module("tied", std::make_shared<torch::nn::Module>("Tied"));
    for (const auto& [key, module] : tied_) tied_holder->register_module(key, module);
  }
}

Activations StageModuleImpl::Forward(const Activations& inputs, const MicroBatch& batch) {
  return runner_(layers_, inputs, batch);
}

void StageModuleImpl::set_layer_runner(LayerRunner runner) {
  runner_ = runner ? std::move(runner) : LayerRunner(&RunLayers);
}

namespace {

// PipelineModel::Create's steps: check the options, place the virtual
// stages, cut the layers into them, build this stage's chunks, and describe
// the tie groups.

absl::Status CheckModelOptions(const PipelineModelOptions& options, int64_t stage) {
  if (options.num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages must be >= 1, got ", options.num_stages));
  }
  if (options.chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("chunks must be >= 1, got ", options.chunks));
  }
  if (stage < 0 || stage >= options.num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage, " is outside [0, ", options.num_stages, ")"));
  }
  return absl::OkStatus();
}

// num_stages x chunks.
absl::StatusOr<int64_t> NumVirtualStages(const PipelineModelOptions& options) {
  int64_t num_parts = 0;
  if (__builtin_mul_overflow(options.num_stages, options.chunks, &num_parts)) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages (", options.num_stages, ") x chunks (", options.chunks,
                     ") overflows int64; use fewer stages or chunks"));
  }
  return num_parts;
}

// The stage of each virtual stage: options.stage_to_rank, checked, or looped.
absl::StatusOr<std::vector<int>> ResolvePlacement(const PipelineModelOptions& options,
                                                  int64_t num_parts) {
  std::vector<int> placement;
  if (options.stage_to_rank.empty()) {
    for (int64_t part = 0; part < num_parts; ++part) {
      placement.push_back(static_cast<int>(part % options.num_stages));
    }
    return placement;
  }
  if (static_cast<int64_t>(options.stage_to_rank.size()) != num_parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage_to_rank has ", options.stage_to_rank.size(),
                     " entries; it needs one per virtual stage: num_stages (", options.num_stages,
                     ") x chunks (", options.chunks, ") = ", num_parts));
  }
  std::vector<int64_t> held(options.num_stages, 0);
  for (size_t part = 0; part < options.stage_to_rank.size(); ++part) {
    const int r = options.stage_to_rank[part];
    if (r < 0 || r >= options.num_stages) {
      return absl::InvalidArgumentError(absl::StrCat("stage_to_rank[", part, "] = ", r,
                                                     " is outside [0, ", options.num_stages, ")"));
    }
    ++held[r];
  }
  for (int64_t r = 0; r < options.num_stages; ++r) {
    if (held[r] != options.chunks) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage_to_rank places ", held[r], " virtual stages on stage ", r,
                       "; every stage must hold chunks (", options.chunks, ")"));
    }
  }
  return options.stage_to_rank;
}

// The layer bounds of the virtual stages: options.bounds, checked, or the
// partitioner's.
absl::StatusOr<Bounds> ResolveBounds(const PipelineModelOptions& options,
                                     const std::vector<LayerSpec>& specs, int64_t num_parts) {
  if (!options.bounds.empty()) {
    PP_RETURN_IF_ERROR(
        ValidateBounds(options.bounds, static_cast<int64_t>(specs.size()), num_parts));
    return options.bounds;
  }
  PartitionRequest request;
  request.specs = &specs;
  request.num_parts = num_parts;
  request.base_seed = options.base_seed;
  request.sample_inputs = options.sample_inputs;
  request.sample_batch = options.sample_batch;
  request.profile_repeats = options.profile_repeats;
  return Partition(options.partition_method, std::move(request));
}

// The group of tie key `key` (used at `positions`), the same on every stage.
absl::StatusOr<TieGroup> MakeTieGroup(const PipelineModel& model, const std::string& key,
                                      const std::vector<int64_t>& positions, uint64_t base_seed,
                                      const LayerEnvironment& environment) {
  TieGroup group;
  group.key = key;
  group.layer_indices = positions;
  for (int64_t i : positions) group.stages.push_back(model.StageOfLayer(i));
  std::sort(group.stages.begin(), group.stages.end());
  group.stages.erase(std::unique(group.stages.begin(), group.stages.end()), group.stages.end());
  // Names declared by the spec need no module here (the stages holding the
  // key check them against theirs). Otherwise a stage that does not hold the
  // key builds the module briefly (seeded, then freed) to learn its names, so
  // every stage reports the same group.
  const LayerSpec& spec = model.specs()[positions.front()];
  const std::vector<std::string>& declared = spec.tied_param_names();
  std::vector<std::string> names = declared;
  Layer module = model.TiedModule(key);
  if (module != nullptr || declared.empty()) {
    try {
      if (module == nullptr) {
        module = BuildSpecLayer(spec, positions.front(), base_seed, environment);
      }
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("building the shared module of tie key '", key,
                                                     "' failed: ", ExceptionMessage(e)));
    }
    PP_ASSIGN_OR_RETURN(names, TiedParamNames(key, declared, *module));
  }
  for (const std::string& name : names)
    group.param_names.push_back(absl::StrCat("tied.", key, ".", name));
  return group;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PipelineModel>> PipelineModel::Create(
    std::vector<LayerSpec> specs, const PipelineModelOptions& options, int64_t stage) {
  PP_RETURN_IF_ERROR(ValidateSpecs(specs));
  PP_RETURN_IF_ERROR(CheckModelOptions(options, stage));
  const auto tie_positions = TiePositions(specs);
  PP_RETURN_IF_ERROR(CheckTieConsistency(specs, tie_positions));

  std::unique_ptr<PipelineModel> model(new PipelineModel());
  model->specs_ = std::move(specs);
  model->options_ = options;
  model->stage_ = stage;
  PP_ASSIGN_OR_RETURN(const int64_t num_parts, NumVirtualStages(options));
  PP_RETURN_IF_ERROR(CheckEnoughLayers(model->num_layers(), num_parts));
  PP_ASSIGN_OR_RETURN(model->placement_, ResolvePlacement(options, num_parts));
  PP_ASSIGN_OR_RETURN(model->bounds_, ResolveBounds(options, model->specs_, num_parts));

  std::vector<int64_t> local_parts;
  for (int64_t part = 0; part < num_parts; ++part) {
    if (model->placement_[part] == stage) local_parts.push_back(part);
  }
  for (int64_t c = 0; c < options.chunks; ++c) {
    const int64_t part = local_parts[c];
    PP_ASSIGN_OR_RETURN(
        StageModule chunk,
        BuildRange(model->specs_, part, model->bounds_[part], model->bounds_[part + 1],
                   options.base_seed, options.layer_environment, tie_positions, &model->tied_));
    model->chunks_.push_back(std::move(chunk));
  }
  for (const auto& [key, positions] : tie_positions) {
    PP_ASSIGN_OR_RETURN(TieGroup group, MakeTieGroup(*model, key, positions, options.base_seed,
                                                     options.layer_environment));
    model->tie_groups_.push_back(std::move(group));
  }
  return model;
}

int64_t PipelineModel::PartOfLayer(int64_t layer) const {
  TORCH_CHECK(layer >= 0 && layer < num_layers(), "layer ", layer, " outside [0, ", num_layers(),
              ")");
  return std::upper_bound(bounds_.begin(), bounds_.end(), layer) - bounds_.begin() - 1;
}

int64_t PipelineModel::StageOfLayer(int64_t layer) const { return placement_[PartOfLayer(layer)]; }

int64_t PipelineModel::ChunkOfLayer(int64_t layer) const {
  const int64_t part = PartOfLayer(layer);
  int64_t chunk = 0;
  for (int64_t q = 0; q < part; ++q) chunk += placement_[q] == placement_[part];
  return chunk;
}

torch::OrderedDict<std::string, torch::Tensor> PipelineModel::named_parameters() const {
  std::vector<torch::OrderedDict<std::string, torch::Tensor>> lists;
  for (const StageModule& chunk : chunks_) lists.push_back(chunk->named_parameters());
  return UniqueByTensor(lists);
}

std::vector<torch::Tensor> PipelineModel::parameters() const { return named_parameters().values(); }

torch::OrderedDict<std::string, torch::Tensor> PipelineModel::chunk_named_parameters(
    int64_t c) const {
  return UniqueByTensor({chunks_.at(c)->named_parameters()});
}

torch::OrderedDict<std::string, torch::Tensor> PipelineModel::named_buffers() const {
  std::vector<torch::OrderedDict<std::string, torch::Tensor>> lists;
  for (const StageModule& chunk : chunks_) lists.push_back(chunk->named_buffers());
  return UniqueByTensor(lists);
}

std::vector<TieGroup> PipelineModel::LocalTieGroups() const {
  std::vector<TieGroup> local;
  for (const TieGroup& group : tie_groups_) {
    if (std::binary_search(group.stages.begin(), group.stages.end(), stage_))
      local.push_back(group);
  }
  return local;
}

absl::StatusOr<torch::OrderedDict<std::string, torch::Tensor>> PipelineModel::TiedParameters(
    const std::string& key) const {
  auto group = std::find_if(tie_groups_.begin(), tie_groups_.end(),
                            [&](const TieGroup& g) { return g.key == key; });
  Layer module = TiedModule(key);
  if (group == tie_groups_.end() || module == nullptr) {
    std::vector<std::string> held;
    for (const auto& [k, unused] : tied_) held.push_back(k);
    return absl::NotFoundError(absl::StrCat("stage ", stage_, " holds no tie key '", key,
                                            "'; it holds: [", absl::StrJoin(held, ", "), "]"));
  }
  const auto params = module->named_parameters();
  const std::string prefix = absl::StrCat("tied.", key, ".");
  torch::OrderedDict<std::string, torch::Tensor> out;
  for (const std::string& name : group->param_names) {
    out.insert(name, params[name.substr(prefix.size())]);
  }
  return out;
}

Layer PipelineModel::TiedModule(const std::string& key) const {
  auto it = tied_.find(key);
  return it == tied_.end() ? nullptr : it->second;
}

void PipelineModel::set_layer_runner(const LayerRunner& runner) {
  for (StageModule& chunk : chunks_) chunk->set_layer_runner(runner);
}

void PipelineModel::train(bool on) {
  for (StageModule& chunk : chunks_) chunk->train(on);
}

void PipelineModel::to(torch::Device device) {
  for (StageModule& chunk : chunks_) chunk->to(device);
}

StageModule PipelineModel::ToSequential(const LayerRunner& runner) const {
  absl::StatusOr<StageModule> module = BuildSequential(
      specs_, options_.base_seed, runner, DenseEnvironment(options_.layer_environment));
  // The specs were validated and built once already, so failing now is a bug
  // (or a factory that is not deterministic).
  TORCH_CHECK(module.ok(), "ToSequential: ", module.status().ToString());
  return *std::move(module);
}

std::string PipelineModel::PartitionReport() const {
  std::vector<int64_t> counts;
  for (int64_t i = 0; i < num_layers(); ++i) {
    counts.push_back(SpecParameterCount(specs_[i], i, options_.base_seed));
  }
  return pp::PartitionReport(specs_, bounds_, options_.num_stages, counts, placement_);
}

absl::StatusOr<StageModule> BuildSequential(const std::vector<LayerSpec>& specs, uint64_t base_seed,
                                            const LayerRunner& runner,
                                            const LayerEnvironment& environment) {
  PP_RETURN_IF_ERROR(ValidateSpecs(specs));
  const auto tie_positions = TiePositions(specs);
  PP_RETURN_IF_ERROR(CheckTieConsistency(specs, tie_positions));
  std::map<std::string, Layer> tied;
  PP_ASSIGN_OR_RETURN(StageModule module,
                      BuildRange(specs, /*virtual_stage=*/-1, 0, static_cast<int64_t>(specs.size()),
                                 base_seed, environment, tie_positions, &tied));
  module->set_layer_runner(runner);
  return module;
}

}  // namespace pp
