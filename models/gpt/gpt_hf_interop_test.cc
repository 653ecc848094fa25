// GPT <-> transformers' GPT2LMHeadModel against the real clients
// (checkpoint/hf/hf_interop_testing.h):
//   (1) a pipe GPT exported to a folder loads in GPT2LMHeadModel and gives
//       pipe's logits within 1e-4;
//   (2) a random GPT2LMHeadModel saved with save_pretrained, imported into a
//       pipe checkpoint and loaded by a fresh pipe model, gives transformers'
//       logits within 1e-4.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/hf/hf_interop_testing.h"
#include "models/config_testing.h"
#include "models/gpt/gpt_hf.h"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace {

using hf_testing::ExportAndLoad;
using hf_testing::MakeAndImport;

TEST(GptHfInteropTest, PipeExportsLoadInTransformersWithTheSameLogits) {
  const GptModelConfig gpt = ParseModelConfig<GptModelConfig>(
      "vocab_size: 300 context_length: 16 width: 32 num_heads: 4 num_layers: 2");
  StageModule model = *BuildSequential(*MakeGptSpecs(gpt), 3);
  ExportAndLoad(model, "gpt2",
                [&](const std::string& dir) { return ExportGptModule(*model, gpt, dir); });
}

// GPT-2's random key bias is dropped on import (pipe has none): the logits
// still match, since softmax ignores it.
TEST(GptHfInteropTest, TransformersModelsImportIntoPipeWithTheSameLogits) {
  MakeAndImport("models/gpt/gpt2_hf_reference.py", "gpt2",
                [](const std::string& dir,
                   const std::string& root) -> absl::StatusOr<std::vector<LayerSpec>> {
                  absl::StatusOr<GptModelConfig> config = ImportGpt2Hf(dir, root);
                  if (!config.ok()) return config.status();
                  return MakeGptSpecs(*config);
                });
}

}  // namespace
}  // namespace pp
