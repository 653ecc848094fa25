// LLaMA <-> transformers' LlamaForCausalLM against the real clients
// (checkpoint/hf/hf_interop_testing.h):
//   (1) a pipe LLaMA (tied and untied) exported to a folder loads in
//       LlamaForCausalLM and gives pipe's logits within 1e-4;
//   (2) a random LlamaForCausalLM saved with save_pretrained, imported into a
//       pipe checkpoint and loaded by a fresh pipe model, gives transformers'
//       logits within 1e-4.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf/hf_interop_testing.h"
#include "models/llama/llama_hf.h"
#include "models/llama/llama_hf_testing.h"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace {

using hf_testing::ExportAndLoad;
using hf_testing::MakeAndImport;
using hf_testing::TinyLlama;

TEST(LlamaHfInteropTest, PipeExportsLoadInTransformersWithTheSameLogits) {
  for (bool tied : {false, true}) {
    const LlamaModelConfig config = TinyLlama(tied);
    StageModule model = *BuildSequential(*MakeLlamaSpecs(config), 3);
    ExportAndLoad(model, absl::StrCat("llama_", tied),
                  [&](const std::string& dir) { return ExportLlamaModule(*model, config, dir); });
  }
}

TEST(LlamaHfInteropTest, TransformersModelsImportIntoPipeWithTheSameLogits) {
  MakeAndImport("models/llama/llama_hf_reference.py", "llama",
                [](const std::string& dir,
                   const std::string& root) -> absl::StatusOr<std::vector<LayerSpec>> {
                  absl::StatusOr<LlamaModelConfig> config = ImportLlamaHf(dir, root);
                  if (!config.ok()) return config.status();
                  EXPECT_EQ(config->num_kv_heads(), 2);
                  EXPECT_EQ(config->rope_theta(), 5000.0);
                  return MakeLlamaSpecs(*config);
                });
}

}  // namespace
}  // namespace pp
