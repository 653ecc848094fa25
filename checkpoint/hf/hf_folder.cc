#include "checkpoint/hf/hf_folder.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/model/checkpoint_dir.h"
#include "checkpoint/model/checkpoint_lock.h"
#include "checkpoint/model/model_checkpoint.h"
#include "common/regular_file.h"
#include "pipeline/pipeline_model.h"

namespace pp {

absl::Status WriteHfFolder(const std::string& dir, const HfFolder& folder) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  if (absl::Status s = WriteSafetensors(dir + "/model.safetensors", folder.tensors); !s.ok()) {
    return s;
  }
  std::ofstream out(dir + "/config.json");
  out << folder.config_json << "\n";
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", dir, "/config.json"));
  return absl::OkStatus();
}

absl::StatusOr<HfFolder> ReadHfFolder(const std::string& dir) {
  HfFolder folder;
  absl::StatusOr<std::string> config_json =
      ReadRegularFile("Hugging Face config", dir + "/config.json");
  if (!config_json.ok()) return config_json.status();
  folder.config_json = *std::move(config_json);
  absl::StatusOr<SafetensorsFile> tensors = ReadSafetensors(dir + "/model.safetensors");
  if (!tensors.ok()) return tensors.status();
  folder.tensors = *std::move(tensors);
  return folder;
}

std::map<std::string, torch::Tensor> ModuleParameters(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value();
  return out;
}

absl::Status CopyIntoModule(const std::map<std::string, torch::Tensor>& tensors,
                            const std::string& source, torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> params = ModuleParameters(module);
  for (const auto& [name, tensor] : tensors) {
    if (params.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor for ", name, " has no place in the model"));
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, param] : params) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat(source, " has no tensor for ", name));
    }
    if (it->second.sizes() != param.sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", name, " is [", absl::StrJoin(it->second.sizes(), ", "),
                       "], the model's is [", absl::StrJoin(param.sizes(), ", "), "]"));
    }
    // Training never saves a non-finite state: a NaN here is a corrupt file,
    // to be named now rather than as some gradient's NaN steps later.
    if (it->second.is_floating_point()) {
      const torch::Tensor bad = torch::nonzero(~torch::isfinite(it->second.flatten()));
      if (bad.numel() > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": ", name, " holds ", bad.size(0),
                         " non-finite value(s) (NaN or infinity), ", "the first at flat index ",
                         bad[0][0].item<int64_t>(), "; a model's weights must be finite"));
      }
    }
    param.copy_(it->second.to(param.scalar_type()));
  }
  return absl::OkStatus();
}

absl::Status LoadWholeModelCheckpoint(const std::string& checkpoint, int64_t num_layers,
                                      torch::nn::Module& module) {
  ModelState state = ModelStateOfModule(module, num_layers);
  LoadOptions options;
  options.load_optimizer = false;
  absl::StatusOr<LoadReport> report =
      LoadCheckpoint(checkpoint, state, nullptr, CheckpointRank(), options);
  if (!report.ok()) return report.status();
  if (!report->missing.empty() || !report->unexpected.empty() ||
      !report->shape_mismatches.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(checkpoint, " does not match the model's config: ", report->Summary()));
  }
  return absl::OkStatus();
}

absl::Status SaveWholeModelCheckpoint(const torch::nn::Module& module, int64_t num_layers,
                                      const std::string& root, const std::string& imported_from) {
  // Like a fresh training run (issue #42, class 1): never into a directory a
  // live run holds, nor one holding checkpoints, whose owner's resume=auto
  // would continue from the import and push its own steps aside.
  absl::StatusOr<std::unique_ptr<CheckpointDirLock>> lock =
      CheckpointDirLock::Acquire(root, ThisProcessAsHolder("", "hf_convert import"));
  if (!lock.ok()) return lock.status();
  if (absl::Status s = CheckRootHoldsNoCheckpoints(root); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot import into ", root, ": ", s.message(),
                     ". An import writes step 0: give it a new or empty directory"));
  }
  ModelState state = ModelStateOfModule(module, num_layers);
  SaveRequest request;
  request.root = root;
  request.step = 0;
  request.model = &state;
  request.metadata["imported_from"] = imported_from;
  return SaveCheckpoint(request, CheckpointRank()).status();
}

absl::StatusOr<std::map<std::string, torch::Tensor>> LoadCheckpointParameters(
    const std::string& checkpoint, const std::vector<LayerSpec>& specs) {
  absl::StatusOr<StageModule> model = BuildSequential(specs, 0);
  if (!model.ok()) return model.status();
  const auto num_layers = static_cast<int64_t>(specs.size());
  if (absl::Status s = LoadWholeModelCheckpoint(checkpoint, num_layers, **model); !s.ok()) {
    return s;
  }
  return ModuleParameters(**model);
}

absl::Status ExportCheckpointToHf(const std::string& checkpoint,
                                  const std::vector<LayerSpec>& specs,
                                  const std::string& config_json, const ToHfFn& to_hf,
                                  const std::string& hf_dir) {
  absl::StatusOr<std::map<std::string, torch::Tensor>> parameters =
      LoadCheckpointParameters(checkpoint, specs);
  if (!parameters.ok()) return parameters.status();
  absl::StatusOr<SafetensorsFile> tensors = to_hf(*parameters);
  if (!tensors.ok()) return tensors.status();
  return WriteHfFolder(hf_dir, {config_json, *std::move(tensors)});
}

absl::Status ImportHfToCheckpoint(const std::string& hf_dir, const SafetensorsFile& tensors,
                                  const std::vector<LayerSpec>& specs, const FromHfFn& from_hf,
                                  const std::string& root) {
  absl::StatusOr<StageModule> model = BuildSequential(specs, 0);
  if (!model.ok()) return model.status();
  absl::StatusOr<std::map<std::string, torch::Tensor>> pipe = from_hf(tensors);
  if (!pipe.ok()) return pipe.status();
  if (absl::Status s = CopyIntoModule(*pipe, hf_dir, **model); !s.ok()) return s;
  return SaveWholeModelCheckpoint(**model, static_cast<int64_t>(specs.size()), root, hf_dir);
}

}  // namespace pp
