// What the Hugging Face converters' tests share, whatever the model: temporary
// paths, a whole model's logits and the checks of a config.json reader. The converters live in
// their models' packages (models/gpt/gpt_hf.h, models/llama/llama_hf.h); their tests against the
// real transformers use hf_interop_testing.h. Test-only.
#ifndef CHECKPOINT_HF_HF_TEST_SUPPORT_H_
#define CHECKPOINT_HF_HF_TEST_SUPPORT_H_

#include <functional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace hf_testing {

inline std::string TempPath(const std::string& name) {
  return absl::StrCat(testing::TempDir(), "/", name);
}

// The last layer's output of a whole (ToSequential/BuildSequential) model.
inline torch::Tensor Logits(StageModule& model, const torch::Tensor& ids) {
  MicroBatch batch;
  batch.tensors["input_ids"] = ids;
  torch::NoGradGuard no_grad;
  return model->Forward({}, batch)[0];
}

// Issue #42 class 3, for a converter's config.json reader `refusal` (the
// message of its status, "" when it accepts): `good` is accepted; each of
// its fields and of `extra` that the reader reads (not in `not_read`), set
// to a value of the wrong JSON type, is refused naming the field; the size
// field `width` at 0 and vocab_size beyond int64 are refused naming them.
inline void ExpectConfigFieldsChecked(const std::function<std::string(const std::string&)>& refusal,
                                      const nlohmann::json& good, std::vector<std::string> extra,
                                      const std::set<std::string>& not_read,
                                      const std::string& width) {
  ASSERT_EQ(refusal(good.dump()), "");
  for (const auto& [key, value] : good.items()) extra.push_back(key);
  for (const std::string& field : extra) {
    if (not_read.count(field) > 0) continue;
    const bool known = good.contains(field);
    nlohmann::json j = good;
    j[field] = (known && good[field].is_string()) ? nlohmann::json(7) : nlohmann::json("two");
    EXPECT_NE(refusal(j.dump()).find("config.json: " + field + " ("), std::string::npos)
        << field << ": " << refusal(j.dump());
  }
  nlohmann::json zero = good;
  zero[width] = 0;
  EXPECT_NE(refusal(zero.dump())
                .find("config.json: " + width + " (0) must be an integer in [1, 1073741824]"),
            std::string::npos);
  nlohmann::json huge = good;
  huge["vocab_size"] = 18446744073709551615ull;
  EXPECT_NE(refusal(huge.dump()).find("config.json: vocab_size (18446744073709551615)"),
            std::string::npos);
}

}  // namespace hf_testing
}  // namespace pp

#endif  // CHECKPOINT_HF_HF_TEST_SUPPORT_H_
