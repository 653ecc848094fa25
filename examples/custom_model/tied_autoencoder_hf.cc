#include "examples/custom_model/tied_autoencoder_hf.h"

#include <map>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf/hf_folder.h"
#include "checkpoint/hf/hf_json.h"
#include "common/status_macros.h"
#include "examples/custom_model/tied_autoencoder.h"
#include "nlohmann/json.hpp"

namespace custom_model {
namespace {

// (pipe name, Hugging Face name) of every tensor.
std::vector<std::pair<std::string, std::string>> NamePairs(int64_t blocks) {
  std::vector<std::pair<std::string, std::string>> pairs = {{"tied.code.weight", "encoder.weight"}};
  for (int64_t i = 0; i < blocks; ++i) {
    for (const char* x : {"weight", "bias"}) {
      pairs.emplace_back(absl::StrCat("layers.", i + 1, ".linear.", x),
                         absl::StrCat("blocks.", i, ".linear.", x));
    }
  }
  return pairs;
}

// Renames `from`'s tensors (first -> second of each pair, or back); every one
// must be there, and nothing else.
absl::StatusOr<std::map<std::string, torch::Tensor>> Rename(
    const std::map<std::string, torch::Tensor>& from, int64_t blocks, bool to_hf,
    const std::string& source) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [pipe, hf] : NamePairs(blocks)) {
    const std::string& have = to_hf ? pipe : hf;
    auto it = from.find(have);
    if (it == from.end()) {
      return absl::InvalidArgumentError(absl::StrCat(source, " has no tensor ", have));
    }
    out[to_hf ? hf : pipe] = it->second.detach().to(torch::kCPU);
  }
  if (out.size() != from.size()) {
    return absl::InvalidArgumentError(absl::StrCat(source, " has ", from.size(),
                                                   " tensors; a tied autoencoder of ", blocks,
                                                   " blocks has ", out.size()));
  }
  return out;
}

std::vector<pp::LayerSpec> Specs(int64_t blocks) {
  return TiedAutoencoderSpecs(static_cast<int>(blocks));
}

}  // namespace

std::string TiedAutoencoderHfConfigJson(int64_t blocks) {
  const nlohmann::ordered_json j = {
      {"architectures", {"TiedAutoencoder"}},
      {"model_type", kHfModelType},
      {"features", kFeatures},
      {"code", kCode},
      {"blocks", blocks},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
  };
  return j.dump(2);
}

absl::StatusOr<int64_t> TiedAutoencoderBlocksFromHfJson(const std::string& json_text) {
  PP_ASSIGN_OR_RETURN(const nlohmann::json j, pp::ParseHfConfig(json_text, kHfModelType));
  // The sizes are this package's constants: a folder of another shape is refused.
  PP_RETURN_IF_ERROR(pp::HfIntField(j, "features", kFeatures, kFeatures).status());
  PP_RETURN_IF_ERROR(pp::HfIntField(j, "code", kCode, kCode).status());
  return pp::HfIntField(j, "blocks", 0, 1000);
}

absl::Status ExportTiedAutoencoderCheckpoint(const std::string& checkpoint, int64_t blocks,
                                             const std::string& hf_dir) {
  return pp::ExportCheckpointToHf(
      checkpoint, Specs(blocks), TiedAutoencoderHfConfigJson(blocks),
      [&](const std::map<std::string, torch::Tensor>& pipe) -> absl::StatusOr<pp::SafetensorsFile> {
        PP_ASSIGN_OR_RETURN(auto hf, Rename(pipe, blocks, /*to_hf=*/true, "the model"));
        pp::SafetensorsFile file;
        file.metadata["format"] = "pt";
        for (const auto& [pipe_name, hf_name] : NamePairs(blocks)) {
          file.tensors.emplace_back(hf_name, hf.at(hf_name));
        }
        return file;
      },
      hf_dir);
}

absl::StatusOr<int64_t> ImportTiedAutoencoderHf(const std::string& hf_dir,
                                                const std::string& root) {
  PP_ASSIGN_OR_RETURN(const pp::HfFolder folder, pp::ReadHfFolder(hf_dir));
  PP_ASSIGN_OR_RETURN(const int64_t blocks, TiedAutoencoderBlocksFromHfJson(folder.config_json));
  PP_RETURN_IF_ERROR(pp::ImportHfToCheckpoint(
      hf_dir, folder.tensors, Specs(blocks),
      [&](const pp::SafetensorsFile& hf) {
        const std::map<std::string, torch::Tensor> by_name(hf.tensors.begin(), hf.tensors.end());
        return Rename(by_name, blocks, /*to_hf=*/false, hf_dir + "/model.safetensors");
      },
      root));
  return blocks;
}

}  // namespace custom_model
