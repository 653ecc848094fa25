#include "models/gpt/sample.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pp {

int64_t PickToken(const torch::Tensor& logits, const SampleOptions& options,
                  torch::Generator& generator) {
  torch::Tensor scores =
      logits.detach().to(torch::kFloat).reshape({-1}).slice(0, 0, options.max_token_id);
  if (options.top_k <= 1) return scores.argmax().item<int64_t>();
  const int64_t k = std::min<int64_t>(options.top_k, scores.size(0));
  auto [top_values, top_indices] = scores.topk(k);
  // In double and relative to the best score: the best becomes exp(0) = 1 at
  // any temperature, so a tiny one (1e-300, which in float is 0 and made
  // logits / t inf and the softmax NaN) is greedy, and a huge one uniform,
  // never NaN. topk sorts, so the first value is the best.
  torch::Tensor shifted = top_values.to(torch::kDouble) - top_values[0].item<double>();
  torch::Tensor probs = torch::softmax(shifted / options.temperature, /*dim=*/0);
  const int64_t choice =
      torch::multinomial(probs, 1, /*replacement=*/false, generator).item<int64_t>();
  return top_indices[choice].item<int64_t>();
}

absl::StatusOr<std::vector<int64_t>> Generate(const std::vector<int64_t>& prompt,
                                              int64_t context_length, const SampleOptions& options,
                                              const NextTokenLogitsFn& logits_fn) {
  if (prompt.empty()) return absl::InvalidArgumentError("sampling needs a non-empty prompt");
  if (options.num_tokens < 0 || options.top_k < 1 || !(options.temperature > 0) ||
      context_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad sampling options: num_tokens ", options.num_tokens, " (>= 0), top_k ",
                     options.top_k, " (>= 1), temperature ", options.temperature,
                     " (> 0), context ", context_length, " (>= 1)"));
  }
  torch::Generator generator = torch::make_generator<at::CPUGeneratorImpl>(options.seed);
  std::vector<int64_t> tokens = prompt;
  for (int64_t i = 0; i < options.num_tokens; ++i) {
    const int64_t used = std::min<int64_t>(static_cast<int64_t>(tokens.size()), context_length);
    torch::Tensor window = torch::zeros({1, context_length}, torch::kLong);
    auto w = window.accessor<int64_t, 2>();
    for (int64_t j = 0; j < used; ++j) w[0][j] = tokens[tokens.size() - used + j];
    absl::StatusOr<torch::Tensor> logits = logits_fn(window, used - 1);
    if (!logits.ok()) return logits.status();
    tokens.push_back(PickToken(*logits, options, generator));
  }
  return tokens;
}

}  // namespace pp
