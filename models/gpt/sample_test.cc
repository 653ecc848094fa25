#include "models/gpt/sample.h"

#include <set>

#include <gtest/gtest.h>

namespace pp {
namespace {

// Logits that favour (the token at `position`) + 1, then + 2, + 3, ...
NextTokenLogitsFn Counting(std::vector<torch::Tensor>* windows = nullptr) {
  return [windows](const torch::Tensor& window, int64_t position) -> absl::StatusOr<torch::Tensor> {
    if (windows != nullptr) windows->push_back(window.clone());
    const int64_t last = window[0][position].item<int64_t>();
    torch::Tensor logits = torch::zeros({260});
    for (int64_t d = 1; d <= 4; ++d) logits[(last + d) % 256] = 10.0 - d;
    logits[257] = 100;  // a special token: must never be produced
    return logits;
  };
}

TEST(GenerateTest, GreedyFollowsTheArgmaxAndSlidesTheWindow) {
  std::vector<torch::Tensor> windows;
  SampleOptions o{.num_tokens = 6, .top_k = 1};
  absl::StatusOr<std::vector<int64_t>> out = Generate({10, 20}, 4, o, Counting(&windows));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, (std::vector<int64_t>{10, 20, 21, 22, 23, 24, 25, 26}));
  // Fixed-size windows, right-padded, then the newest 4 tokens.
  EXPECT_TRUE(torch::equal(windows[0], torch::tensor({{10, 20, 0, 0}}, torch::kLong)));
  EXPECT_TRUE(torch::equal(windows.back(), torch::tensor({{22, 23, 24, 25}}, torch::kLong)));
}

TEST(GenerateTest, TopKSamplesOnlyAmongTheBestAndIsSeeded) {
  SampleOptions o{.num_tokens = 200, .top_k = 3, .temperature = 5.0, .seed = 9};
  absl::StatusOr<std::vector<int64_t>> a = Generate({0}, 8, o, Counting());
  absl::StatusOr<std::vector<int64_t>> b = Generate({0}, 8, o, Counting());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  std::set<int64_t> steps;
  for (size_t i = 1; i < a->size(); ++i) steps.insert(((*a)[i] - (*a)[i - 1] + 256) % 256);
  EXPECT_EQ(steps, (std::set<int64_t>{1, 2, 3}));
  o.seed = 10;
  EXPECT_NE(*Generate({0}, 8, o, Counting()), *a);
}

// Issue 29: sample_temperature=1e-300 (accepted: > 0) aborted in sampling:
// logits / 1e-300 overflow to inf and softmax gives NaN. A temperature that
// small is greedy: the argmax, every time; a huge one is near uniform over
// the top k, never a crash.
TEST(GenerateTest, ExtremeTemperaturesSampleWithoutNaN) {
  for (double t : {1e-300, 4.9e-324, 1e-45, 1e-8}) {
    SampleOptions o{.num_tokens = 5, .top_k = 5, .temperature = t, .seed = 3};
    absl::StatusOr<std::vector<int64_t>> out = Generate({10}, 4, o, Counting());
    ASSERT_TRUE(out.ok()) << "temperature " << t << ": " << out.status();
    EXPECT_EQ(*out, (std::vector<int64_t>{10, 11, 12, 13, 14, 15})) << "temperature " << t;
  }
  SampleOptions hot{.num_tokens = 50, .top_k = 3, .temperature = 1e300, .seed = 3};
  absl::StatusOr<std::vector<int64_t>> out = Generate({0}, 8, hot, Counting());
  ASSERT_TRUE(out.ok()) << out.status();
  for (size_t i = 1; i < out->size(); ++i) {
    const int64_t step = ((*out)[i] - (*out)[i - 1] + 256) % 256;
    EXPECT_TRUE(step >= 1 && step <= 3) << step;
  }
}

TEST(GenerateTest, RejectsBadInput) {
  EXPECT_EQ(Generate({}, 8, {}, Counting()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Generate({1}, 8, {.top_k = 0}, Counting()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pp
