// What every model's Hugging Face converter shares: the folder (config.json +
// model.safetensors), a module's parameters by global name, and pipe
// checkpoints of a whole (ToSequential) model. A converter (a model's own
// package: models/gpt/gpt_hf.h, models/llama/llama_hf.h,
// examples/custom_model/tied_autoencoder_hf.h) supplies config.json and the
// name mapping; ExportCheckpointToHf and ImportHfToCheckpoint do the rest.
// Thread-compatible.
#ifndef CHECKPOINT_HF_HF_FOLDER_H_
#define CHECKPOINT_HF_HF_FOLDER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/hf/safetensors.h"
#include "pipeline/layers/layer_spec.h"

namespace pp {

struct HfFolder {
  std::string config_json;
  SafetensorsFile tensors;
};

// Creates `dir` and writes config.json and model.safetensors.
absl::Status WriteHfFolder(const std::string& dir, const HfFolder& folder);
absl::StatusOr<HfFolder> ReadHfFolder(const std::string& dir);

// Global name -> parameter (the live tensors).
std::map<std::string, torch::Tensor> ModuleParameters(const torch::nn::Module& module);

// Copies `tensors` into `module`'s parameters; InvalidArgument naming `source`
// and the tensor for a missing, extra or differently shaped one.
absl::Status CopyIntoModule(const std::map<std::string, torch::Tensor>& tensors,
                            const std::string& source, torch::nn::Module& module);

// Loads the pipe checkpoint `checkpoint` (a step directory or a root) into a
// whole model of `num_layers` layers, strictly, without optimizer state.
absl::Status LoadWholeModelCheckpoint(const std::string& checkpoint, int64_t num_layers,
                                      torch::nn::Module& module);
// Saves a whole model as step 0 of a pipe checkpoint under `root`, which must
// hold no checkpoint and no live run's lock (FailedPrecondition naming it).
absl::Status SaveWholeModelCheckpoint(const torch::nn::Module& module, int64_t num_layers,
                                      const std::string& root, const std::string& imported_from);

// The parameters (global name -> tensor) of the pipe checkpoint `checkpoint`
// (a step directory or a root) of the model `specs` build, loaded strictly
// into one whole model: what an export writes, and what a test compares a
// folder with.
absl::StatusOr<std::map<std::string, torch::Tensor>> LoadCheckpointParameters(
    const std::string& checkpoint, const std::vector<LayerSpec>& specs);

// A model's name mapping, for the two helpers below.
using ToHfFn =
    std::function<absl::StatusOr<SafetensorsFile>(const std::map<std::string, torch::Tensor>&)>;
using FromHfFn =
    std::function<absl::StatusOr<std::map<std::string, torch::Tensor>>(const SafetensorsFile&)>;

// Builds `specs` as one model, loads the pipe checkpoint into it and writes
// the folder with `config_json` and `to_hf`'s tensors.
absl::Status ExportCheckpointToHf(const std::string& checkpoint,
                                  const std::vector<LayerSpec>& specs,
                                  const std::string& config_json, const ToHfFn& to_hf,
                                  const std::string& hf_dir);
// Builds `specs` as one model, copies `from_hf` of the folder's tensors into it
// and saves it as step 0 of a pipe checkpoint under `root`.
absl::Status ImportHfToCheckpoint(const std::string& hf_dir, const SafetensorsFile& tensors,
                                  const std::vector<LayerSpec>& specs, const FromHfFn& from_hf,
                                  const std::string& root);

}  // namespace pp

#endif  // CHECKPOINT_HF_HF_FOLDER_H_
