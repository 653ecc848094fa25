// Layer-wise model checkpoints of pipeline-parallel training: save from any
// pipe x data x model layout, load into any other one or into ToSequential().
//
// Parameters carry global, partition-independent names (pipeline/
// pipeline_model.h): "layers.<i>.<local>" and "tied.<key>.<local>". They map
// onto files named by global layer index, like DeepSpeed's:
//
//   layer_07-model_states.pt   {"fc1.weight": T, "fc1.bias": T}
//   layer_07-optim_states.pt   {"fc1.weight.exp_avg": T, ".exp_avg_sq", ".step", ...}
//   tied_wte-model_states.pt   {"weight": T}          (saved once, by the lowest stage holding it)
//   tied_wte-optim_states.pt
//   rank_state-pipe_01-data_00-model_00.pt   per-rank RNG / loader state
//   manifest.textproto                       see checkpoint/model/manifest.proto
//
// (with "-model_XX" after the layer index when the model-parallel axis is > 1:
// each tensor-parallel rank's shards, a whole tensor in every rank's file).
// Optimizer state travels with its layer, so it reshards with the layers.
// Loading into another tensor-parallel size merges the checkpoint ranks'
// slices of a shard (the manifest records how each splits) and cuts this
// rank's slice; a vocabulary padded for one tp is re-padded for the other.
// Within a stage the files are spread over the data-parallel ranks; every file
// has exactly one writer. Saving is collective over the world group (when
// there is one); loading is local: each rank reads the files of its layers.
//
// Thread-compatible free functions. One save at a time per root (two jobs
// must not share a root: checkpoint_lock.h; each save writes into a
// temporary folder of its own all the same). Only the CPU RNG is captured by callers here
// (trainer_checkpoint.h); CUDA generator states are not.
//
// Next: checkpoint/model/tensor_file.h (file format), checkpoint_dir.h (atomic commit).
#ifndef CHECKPOINT_MODEL_MODEL_CHECKPOINT_H_
#define CHECKPOINT_MODEL_MODEL_CHECKPOINT_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/model/checkpoint_dir.h"
#include "checkpoint/model/manifest.pb.h"
#include "checkpoint/model/tensor_file.h"
#include "pipeline/tensor_parallel/sharded_module.h"
#include "topology/process_group.h"

namespace pp {

// Where this process sits, to decide which files it writes. Copyable.
struct CheckpointRank {
  int rank = 0;
  int world_size = 1;
  int stage = 0;
  int num_stages = 1;
  int data_rank = 0;
  int data_size = 1;
  int model_rank = 0;
  int model_size = 1;
  // All ranks; saving synchronizes on it. Null when world_size == 1.
  ProcessGroupPtr world;
  // Bounds every collective wait of a save.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// The tensors one rank holds, under global names. The tensors are the live
// parameters/buffers (loading copies into them; the optimizer's state is
// matched to them by identity).
struct ModelState {
  TensorDict tensors;
  // Tie key -> the stage that writes it (the lowest stage holding it), for
  // every key of the model. A key this rank holds but that is not listed is
  // written by this rank's stage. When set (or on a one-stage model), loading
  // reports tie files of other keys as unexpected.
  std::map<std::string, int> tie_writer_stage;
  // Layers of the whole model, -1 when unknown. With it, loading reports
  // checkpoint layers beyond the model as unexpected.
  int64_t num_layers = -1;
  // The tensors that are tensor-parallel shards (global name -> how they
  // split); empty on a dense model. Saving records them in the manifest;
  // loading cuts this rank's slices by them when the checkpoint's tp differs.
  std::map<std::string, tensor_parallel::ShardSpec> shard_dims;
};

// The named parameters and buffers of `module` (a StageModule or the
// ToSequential module), each tensor once.
ModelState ModelStateOfModule(const torch::nn::Module& module, int64_t num_layers = -1);

// Where a global name lives in a checkpoint.
struct TensorLocation {
  int64_t layer = -1;   // for "layers.<i>.*"
  std::string tie_key;  // for "tied.<key>.*"
  std::string local;    // the rest: the key inside the file
};
// InvalidArgument naming `name` unless it is "layers.<i>.<local>" or "tied.<key>.<local>".
absl::StatusOr<TensorLocation> LocateTensor(const std::string& name);

// The optimizer's state of `param` (named `name` in errors) as the
// checkpoint's entries, suffix -> tensor ("step", "exp_avg", "exp_avg_sq",
// "max_exp_avg_sq" for Adam and AdamW; "momentum_buffer" for SGD); empty
// before its first step. The tensors are the optimizer's own (not copies).
// Unimplemented for other optimizers.
absl::StatusOr<TensorDict> OptimizerStateTensors(const torch::optim::Optimizer& optimizer,
                                                 const at::Tensor& param, const std::string& name);
// Installs `entries` (as OptimizerStateTensors gives them; copied onto
// param's device) as `param`'s state. DataLoss naming `file` for a missing
// entry or a moment of another shape than `param`.
absl::Status SetOptimizerStateTensors(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                      const std::string& name,
                                      const std::map<std::string, at::Tensor>& entries,
                                      const std::string& file);

// File name of a layer's or tie key's model ("model") or optimizer ("optim") states.
std::string LayerFileName(int64_t layer, int model_rank, int model_size, const std::string& kind);
// Data-parallel rank `data_rank`'s part of an optimizer file
// ("layer_03-model_01-optim_states.pt" -> "layer_03-model_01-data_02-optim_states.pt";
// SaveRequest::optimizer_slices).
std::string DataSliceFileName(const std::string& optim_file, int data_rank);
std::string TiedFileName(const std::string& key, int model_rank, int model_size,
                         const std::string& kind);
std::string RankStateFileName(int stage, int data_rank, int model_rank);

struct SaveRequest {
  // Directory holding step_N/ checkpoints and `latest`.
  std::string root;
  int64_t step = 0;
  // Prune to this many checkpoints after a successful save; <= 0 keeps all.
  int keep_last = 0;
  const ModelState* model = nullptr;
  // Optional. Its parameters must be tensors of `model` (matched by identity);
  // Adam, AdamW and SGD state is saved.
  const torch::optim::Optimizer* optimizer = nullptr;
  // Optional, instead of `optimizer`: a distributed optimizer's state, of
  // which each data-parallel rank writes its own part (Megatron's sharded
  // optimizer checkpoint). Per tensor name of `model`: the range of its
  // flattened elements this rank owns, from `offset`, and `value` (1-D), a
  // parameter of `slices_optimizer`, which holds that part's state. Every
  // data-parallel rank writes a file per layer of its stage
  // (DataSliceFileName; none where it owns nothing of the layer), its
  // entries recorded as slices; a load puts every data rank's parts
  // together, so the checkpoint loads at any dp, with or without the
  // distributed optimizer.
  struct OptimizerSlice {
    int64_t offset = 0;
    at::Tensor value;
  };
  std::map<std::string, OptimizerSlice> optimizer_slices;
  const torch::optim::Optimizer* slices_optimizer = nullptr;
  // Step, LR schedule position, data position, seed (rank 0's is written).
  checkpoint::TrainerInfo trainer;
  // Per-rank tensors needed to continue exactly (RNG states, loader state):
  // written by every rank to its own rank_state file. May be empty.
  TensorDict rank_state;
  checkpoint::TopologyInfo topology;
  // The experiment config, text format (rank 0's is written).
  std::string config;
  std::map<std::string, std::string> metadata;
  // The run writing it (Manifest.owner), stable across its restarts.
  std::string owner;
};

// Every rank of `rank.world` calls it: they agree whether a phase of
// checkpointing succeeded. Returns `local` when it failed here, Aborted naming
// the lowest failing rank when another rank failed, OK when all succeeded.
absl::Status AgreeOnCheckpointStatus(const CheckpointRank& rank, const absl::Status& local,
                                     const std::string& phase);

// Saves one checkpoint; every rank of `rank.world` calls it. Returns the final
// directory after it is complete, durable and named by `latest`. When any
// rank fails, none commits: the previous checkpoint stays `latest`, and every
// rank returns an error (its own, or one naming the rank that failed).
absl::StatusOr<std::string> SaveCheckpoint(const SaveRequest& request, const CheckpointRank& rank);

struct LoadOptions {
  // Every tensor of the model present with equal shape, every tensor of the
  // files read known to the model, optimizer state for every parameter (when
  // the checkpoint has any). Otherwise differences go to the report.
  bool strict = true;
  bool load_optimizer = true;
};

struct LoadReport {
  std::string dir;
  checkpoint::Manifest manifest;
  // Global names this rank holds that the checkpoint lacks.
  std::vector<std::string> missing;
  // Global names (or whole files) in the checkpoint this rank cannot place.
  std::vector<std::string> unexpected;
  // "name: checkpoint [a, b] vs model [c, d] (file)" for skipped tensors.
  std::vector<std::string> shape_mismatches;
  // Parameters that got no optimizer state.
  std::vector<std::string> optimizer_missing;
  int64_t tensors_loaded = 0;
  int64_t optimizer_states_loaded = 0;
  int64_t bytes_read = 0;
  // This rank's saved rank_state when the checkpoint has one for the same
  // (stage, data) coordinates and pipe x data layout (under another
  // tensor-parallel size, tp rank 0's: a model group's ranks share it); else
  // empty.
  TensorDict rank_state;
  bool rank_state_found = false;

  bool clean() const {
    return missing.empty() && unexpected.empty() && shape_mismatches.empty() &&
           optimizer_missing.empty();
  }
  // One line per problem, for logs.
  std::string Summary() const;
};

// Loads the checkpoint at `path` (a checkpoint directory, or a root with
// `latest`) into `model` (copying into its tensors) and `optimizer` (optional;
// state is created for its parameters). Local: no collectives. Errors name the
// file and the problem (missing, checksum, shape, newer format, not a
// checkpoint). `rank` picks the model-parallel files and the rank_state.
absl::StatusOr<LoadReport> LoadCheckpoint(const std::string& path, ModelState& model,
                                          torch::optim::Optimizer* optimizer,
                                          const CheckpointRank& rank,
                                          const LoadOptions& options = {});

}  // namespace pp

#endif  // CHECKPOINT_MODEL_MODEL_CHECKPOINT_H_
