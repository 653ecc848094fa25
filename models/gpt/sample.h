// Text generation from a GPT: greedy or top-k sampling, one token per forward
// pass over a fixed window, so the same code drives the sequential model and a
// pipeline (driver/run_experiment.cc feeds it through the forward-only schedule).
//
// The window is always context_length tokens: the prompt and the tokens so far
// (the newest context_length of them), right-padded with byte 0. Attention is
// causal, so padding after position t does not change the logits at t, and a
// fixed shape keeps pipeline p2p free of shape changes.
#ifndef MODELS_GPT_SAMPLE_H_
#define MODELS_GPT_SAMPLE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"

namespace pp {

struct SampleOptions {
  int64_t num_tokens = 100;
  // 1 = greedy (argmax); k > 1: sample among the k most likely tokens.
  int64_t top_k = 1;
  double temperature = 1.0;
  uint64_t seed = 0;
  // Ids at or above this are never produced (the GPT's vocabulary includes
  // BERT's special tokens, which are not text).
  int64_t max_token_id = 256;
};

// Given the window [1, context_length] and the position whose next token is
// wanted, returns that position's logits [vocab]. Must return the same logits
// on every rank that calls Generate (pipeline: broadcast from the last stage).
using NextTokenLogitsFn =
    std::function<absl::StatusOr<torch::Tensor>(const torch::Tensor& window, int64_t position)>;

// Appends options.num_tokens tokens to `prompt` (non-empty). Deterministic in
// the logits and options.seed. InvalidArgument for an empty prompt or bad
// options.
absl::StatusOr<std::vector<int64_t>> Generate(const std::vector<int64_t>& prompt,
                                              int64_t context_length, const SampleOptions& options,
                                              const NextTokenLogitsFn& logits_fn);

// One token from `logits` [vocab] by the options' rule.
int64_t PickToken(const torch::Tensor& logits, const SampleOptions& options,
                  torch::Generator& generator);

}  // namespace pp

#endif  // MODELS_GPT_SAMPLE_H_
