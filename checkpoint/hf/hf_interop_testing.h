// A model's Hugging Face converter against the real clients: transformers,
// safetensors and torch from the pinned venv tools/python_envs/torch-newest.txt
// (made once per machine by tools/python_env.sh; the first run downloads it),
// driven through hf_check.py. A test that includes this lists
// //checkpoint/hf:hf_check.py, //tools:python_env.sh and
// //tools:python_envs/torch-newest.txt in its data and is tagged "local".
//
//   ExportAndLoad: a pipe model exported to a folder loads in transformers
//     with pipe's logits within 1e-4.
//   MakeAndImport: a random transformers model (save_pretrained) imported into
//     a pipe checkpoint and loaded by a fresh pipe model gives transformers'
//     logits within 1e-4.
// hf_check.py names no model: transformers picks the class from the folder's
// config.json, and MakeAndImport takes the model package's reference script.
// Test-only.
#ifndef CHECKPOINT_HF_HF_INTEROP_TESTING_H_
#define CHECKPOINT_HF_HF_INTEROP_TESTING_H_

#include <pwd.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "checkpoint/hf/hf_test_support.h"
#include "checkpoint/hf/safetensors.h"
#include "checkpoint/model/model_checkpoint.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace hf_testing {

inline std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

// Bazel runs tests without HOME; tools/python_env.sh keeps the venv under
// ~/.cache, shared by every run on the machine, so point it at the user's home.
inline void SetHomeForTheSharedVenv() {
  if (std::getenv("HOME") == nullptr) {
    if (const passwd* pw = getpwuid(getuid()); pw != nullptr) setenv("HOME", pw->pw_dir, 1);
  }
}

// stdout of `command`; the exit status in *status.
inline std::string RunCommand(const std::string& command, int* status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return out;
  }
  std::array<char, 4096> buffer;
  while (fgets(buffer.data(), buffer.size(), pipe) != nullptr) out += buffer.data();
  *status = pclose(pipe);
  return out;
}

inline std::string Python() {
  int status = 0;
  SetHomeForTheSharedVenv();
  const std::string venv = RunCommand(Runfile("tools/python_env.sh") + " torch-newest", &status);
  EXPECT_EQ(status, 0) << "tools/python_env.sh torch-newest failed";
  return absl::StrCat(absl::StripSuffix(venv, "\n"), "/bin/python");
}

// Runs hf_check.py with `args`; "" when it exits 0, else its output.
inline std::string Check(const std::string& args) {
  static const std::string python = Python();
  int status = 0;
  const std::string out = RunCommand(
      absl::StrCat(python, " ", Runfile("checkpoint/hf/hf_check.py"), " ", args, " 2>&1"), &status);
  std::cerr << "hf_check.py " << args << ": " << out;
  return status == 0 ? "" : out;
}

// Exports `model` with `export_fn(dir)`, writes its logits on random ids, and
// has transformers load the folder and compare.
inline void ExportAndLoad(StageModule& model, const std::string& name,
                          const std::function<absl::Status(const std::string&)>& export_fn) {
  {
    // Norm weights start at one and biases at zero: random ones make a
    // mix-up visible. (All 1-D parameters are norms or biases.)
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) {
      if (p.dim() == 1) p.uniform_(0.5, 1.5);
    }
  }
  const std::string dir = TempPath("export_" + name);
  ASSERT_TRUE(export_fn(dir).ok());
  const torch::Tensor ids = torch::randint(0, 300, {2, 12}, torch::kLong);
  SafetensorsFile expected;
  expected.tensors = {{"input_ids", ids}, {"logits", Logits(model, ids)}};
  const std::string case_path = TempPath("case_" + name + ".safetensors");
  ASSERT_TRUE(WriteSafetensors(case_path, expected).ok());
  EXPECT_EQ(Check(absl::StrCat("load ", dir, " ", case_path)), "") << name;
}

// transformers makes and saves a model with the script `reference` (a
// runfile path in the model's package, e.g. models/llama/llama_hf_reference.py)
// and its logits; `import_fn(dir, root)` writes a pipe checkpoint and returns
// the specs to build; a fresh pipe model loads the checkpoint and must match.
inline void MakeAndImport(const std::string& reference, const std::string& name,
                          const std::function<absl::StatusOr<std::vector<LayerSpec>>(
                              const std::string&, const std::string&)>& import_fn) {
  const std::string dir = TempPath("made_" + name);
  const std::string case_path = TempPath("made_" + name + ".safetensors");
  ASSERT_EQ(Check(absl::StrCat("make ", Runfile(reference), " ", dir, " ", case_path)), "");
  const std::string root = TempPath("imported_" + name);
  absl::StatusOr<std::vector<LayerSpec>> specs = import_fn(dir, root);
  ASSERT_TRUE(specs.ok()) << specs.status();
  StageModule model = *BuildSequential(*specs, 9);
  ModelState state = ModelStateOfModule(*model);
  LoadOptions options;
  options.load_optimizer = false;
  absl::StatusOr<LoadReport> report =
      LoadCheckpoint(root, state, nullptr, CheckpointRank(), options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_TRUE(report->clean()) << report->Summary();
  absl::StatusOr<SafetensorsFile> want = ReadSafetensors(case_path);
  ASSERT_TRUE(want.ok()) << want.status();
  const torch::Tensor logits = Logits(model, want->tensors.at(0).second);
  const double diff = (logits - want->tensors.at(1).second).abs().max().item<double>();
  EXPECT_LT(diff, 1e-4) << name;
  std::cerr << name << ": max |pipe - transformers| = " << diff << "\n";
}

}  // namespace hf_testing
}  // namespace pp

#endif  // CHECKPOINT_HF_HF_INTEROP_TESTING_H_
