// check_hf_folder CHECKPOINT HF_DIR BLOCKS [IMPORTED_ROOT]
// Checks hf_convert's export of a tied-autoencoder checkpoint: config.json's
// fields, and model.safetensors holding exactly the checkpoint's tensors under
// the Hugging Face names (the table below, spelled out independently of
// tied_autoencoder_hf.cc), with their shapes and values. With IMPORTED_ROOT,
// the checkpoint `hf_convert import` made of the folder must hold the same
// values as CHECKPOINT. Prints "ok: ..." lines; exits 1 on the first mismatch.
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/hf/hf_folder.h"
#include "examples/custom_model/tied_autoencoder.h"
#include "nlohmann/json.hpp"

namespace {

int Fail(const std::string& what) {
  std::cerr << "FAIL: " << what << std::endl;
  return 1;
}

std::map<std::string, torch::Tensor> Load(const std::string& checkpoint, int blocks) {
  absl::StatusOr<std::map<std::string, torch::Tensor>> p =
      pp::LoadCheckpointParameters(checkpoint, custom_model::TiedAutoencoderSpecs(blocks));
  if (!p.ok()) {
    std::cerr << "FAIL: " << p.status() << std::endl;
    std::exit(1);
  }
  return *p;
}

int Check(const std::string& checkpoint, const std::string& hf_dir, int blocks,
          const std::string& imported) {
  absl::StatusOr<pp::HfFolder> folder = pp::ReadHfFolder(hf_dir);
  if (!folder.ok()) return Fail(std::string(folder.status().message()));
  const nlohmann::json config = nlohmann::json::parse(folder->config_json);
  const nlohmann::json want_config = {{"model_type", "tied_autoencoder"},
                                      {"architectures", {"TiedAutoencoder"}},
                                      {"features", custom_model::kFeatures},
                                      {"code", custom_model::kCode},
                                      {"blocks", blocks}};
  for (const auto& [key, value] : want_config.items()) {
    if (!config.contains(key) || config[key] != value) {
      return Fail(absl::StrCat("config.json ", key, ": ",
                               config.value(key, nlohmann::json()).dump(), ", want ",
                               value.dump()));
    }
  }
  std::cout << "ok: config.json " << want_config.dump() << "\n";

  const std::map<std::string, torch::Tensor> pipe = Load(checkpoint, blocks);
  std::map<std::string, std::string> hf_to_pipe = {{"encoder.weight", "tied.code.weight"}};
  for (int i = 0; i < blocks; ++i) {
    for (const char* x : {"weight", "bias"}) {
      hf_to_pipe[absl::StrCat("blocks.", i, ".linear.", x)] =
          absl::StrCat("layers.", i + 1, ".linear.", x);
    }
  }
  if (pipe.size() != hf_to_pipe.size()) {
    std::vector<std::string> names;
    for (const auto& [name, t] : pipe) names.push_back(name);
    return Fail(absl::StrCat("the checkpoint holds ", absl::StrJoin(names, ", "), "; want ",
                             hf_to_pipe.size(), " tensors"));
  }
  if (folder->tensors.tensors.size() != hf_to_pipe.size()) {
    return Fail(absl::StrCat("model.safetensors holds ", folder->tensors.tensors.size(),
                             " tensors, want ", hf_to_pipe.size()));
  }
  for (const auto& [name, tensor] : folder->tensors.tensors) {
    auto it = hf_to_pipe.find(name);
    if (it == hf_to_pipe.end()) return Fail("model.safetensors: unexpected tensor " + name);
    auto p = pipe.find(it->second);
    if (p == pipe.end()) return Fail("the checkpoint has no " + it->second);
    if (tensor.sizes() != p->second.sizes() || !torch::equal(tensor, p->second)) {
      return Fail(absl::StrCat(name, " [", absl::StrJoin(tensor.sizes(), ", "),
                               "] differs from the checkpoint's ", it->second, " [",
                               absl::StrJoin(p->second.sizes(), ", "), "]"));
    }
    std::cout << "ok: " << name << " [" << absl::StrJoin(tensor.sizes(), ", ")
              << "] == " << it->second << "\n";
  }
  if (imported.empty()) return 0;
  const std::map<std::string, torch::Tensor> back = Load(imported, blocks);
  for (const auto& [name, tensor] : pipe) {
    auto it = back.find(name);
    if (it == back.end() || !torch::equal(it->second, tensor)) {
      return Fail("the imported checkpoint's " + name + " differs from the original's");
    }
  }
  std::cout << "ok: the import of the folder holds the checkpoint's " << pipe.size()
            << " tensors\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: check_hf_folder CHECKPOINT HF_DIR BLOCKS [IMPORTED_ROOT]\n";
    return 2;
  }
  return Check(argv[1], argv[2], std::atoi(argv[3]), argc == 5 ? argv[4] : "");
}
