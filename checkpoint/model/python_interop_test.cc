// Python interoperability: every file of a checkpoint written here loads with
// Python's torch.load (Debian's python3-torch) and holds the same tensors.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include "checkpoint/model/model_checkpoint.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pp {
namespace {

namespace fs = std::filesystem;

std::string Python() {
  for (const char* candidate : {"/usr/bin/python3", "python3"}) {
    std::string cmd = std::string(candidate) + " -c 'import torch' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return candidate;
  }
  return "";
}

nlohmann::ordered_json Dump(const TensorDict& dict) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [name, tensor] : dict) {
    at::Tensor t = tensor.contiguous();
    nlohmann::ordered_json values = nlohmann::ordered_json::array();
    at::Tensor flat = t.reshape({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) {
      if (t.is_floating_point()) {
        values.push_back(flat[i].item<double>());
      } else {
        values.push_back(flat[i].item<int64_t>());
      }
    }
    out[name] = {
        {"dtype", c10::toString(t.scalar_type())}, {"shape", t.sizes().vec()}, {"values", values}};
  }
  return out;
}

TEST(PythonInteropTest, TorchLoadReadsEveryFile) {
  std::string python = Python();
  if (python.empty())
    GTEST_SKIP() << "python3 with torch (Debian's python3-torch) is not installed; skipping";
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string root = (fs::path(tmp ? tmp : "/tmp") / "interop").string();
  fs::remove_all(root);

  torch::manual_seed(0);
  auto layers = std::make_shared<torch::nn::Module>();
  auto model = std::make_shared<torch::nn::Module>();
  model->register_module("layers", layers);
  layers->register_module("0", torch::nn::Linear(5, 3));
  layers->register_module("1", torch::nn::BatchNorm1d(3));
  auto tied = model->register_module("tied", std::make_shared<torch::nn::Module>());
  tied->register_module("wte", torch::nn::Embedding(7, 3));
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(1e-2).amsgrad(true));
  for (auto& p : model->parameters()) p.mutable_grad() = torch::randn_like(p);
  optimizer.step();

  ModelState state = ModelStateOfModule(*model, 2);
  SaveRequest request;
  request.root = root;
  request.step = 1;
  request.model = &state;
  request.optimizer = &optimizer;
  request.rank_state = {{"cpu_rng", at::detail::getDefaultCPUGenerator().get_state()}};
  auto dir = SaveCheckpoint(request, CheckpointRank());
  ASSERT_TRUE(dir.ok()) << dir.status();

  // The reference: what C++ reads back from each (checksum-verified) file.
  auto manifest = ReadManifest(*dir);
  ASSERT_TRUE(manifest.ok());
  nlohmann::ordered_json reference = nlohmann::ordered_json::object();
  for (const auto& f : manifest->files()) {
    auto dict = ReadTensorFile(*dir, f);
    ASSERT_TRUE(dict.ok()) << dict.status();
    reference[f.path()] = Dump(*dict);
  }
  ASSERT_TRUE(reference.contains("layer_00-model_states.pt"));
  ASSERT_TRUE(reference["layer_00-optim_states.pt"].contains("weight.max_exp_avg_sq"));
  ASSERT_TRUE(reference["layer_01-model_states.pt"].contains("running_var"));
  ASSERT_TRUE(reference.contains("tied_wte-model_states.pt"));
  std::string ref_path = root + "/reference.json";
  std::ofstream(ref_path) << reference.dump();

  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  std::string script = srcdir ? (fs::path(srcdir) / (workspace ? workspace : "pipe") /
                                 "checkpoint/model/python_interop_check.py")
                                    .string()
                              : "checkpoint/model/python_interop_check.py";
  std::string cmd = python + " " + script + " " + *dir + " " + ref_path + " 2>&1";
  int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 0) << cmd;

  // A flipped reference value must make the script fail (the check can fail).
  reference["layer_00-model_states.pt"]["weight"]["values"][0] = 12345.0;
  std::ofstream(ref_path, std::ios::trunc) << reference.dump();
  rc = std::system((cmd + " >/dev/null").c_str());
  EXPECT_NE(WEXITSTATUS(rc), 0);
}

}  // namespace
}  // namespace pp
