// What checkpoint/hf's tests share: the tiny LLaMA they convert (the shape
// hf_check.py's transformers model has: GQA 4/2, vocabulary 300, context 16)
// and a whole model's logits. Test-only.
#ifndef CHECKPOINT_HF_HF_TEST_SUPPORT_H_
#define CHECKPOINT_HF_HF_TEST_SUPPORT_H_

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "models/llama/llama.h"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace hf_testing {

inline std::string TempPath(const std::string& name) {
  return absl::StrCat(testing::TempDir(), "/", name);
}

inline LlamaConfig TinyLlama(bool tied) {
  return {.vocab_size = 300,
          .context_length = 16,
          .width = 32,
          .num_heads = 4,
          .num_kv_heads = 2,
          .num_layers = 2,
          .intermediate_size = 48,
          .rope_theta = 5000.0,
          .tie_embeddings = tied};
}

// The last layer's output of a whole (ToSequential/BuildSequential) model.
inline torch::Tensor Logits(StageModule& model, const torch::Tensor& ids) {
  MicroBatch batch;
  batch.tensors["input_ids"] = ids;
  torch::NoGradGuard no_grad;
  return model->Forward({}, batch)[0];
}

}  // namespace hf_testing
}  // namespace pp

#endif  // CHECKPOINT_HF_HF_TEST_SUPPORT_H_
