// LLaMA in the runtime's equivalence proof: trained as a pipeline (pp 1 and 2,
// several schedules, data parallelism, tied and untied heads, grouped-query
// attention) it gives the losses, grad norms and final weights of
// ToSequential() trained on the same batches.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "models/data/lm_data.h"
#include "models/llama/llama.h"
#include "pipeline/runtime/equivalence_testing.h"
#include "pipeline/schedule/registry.h"

namespace pp {
namespace {

using testing_runtime::CompareResults;
using testing_runtime::RunConfig;
using testing_runtime::RunResult;
using testing_runtime::TrainPipeline;
using testing_runtime::TrainSequential;

constexpr double kRtol = 1e-5;

std::vector<int64_t> Tokens() {
  std::string text;
  for (int i = 0; i < 60; ++i) {
    text += absl::StrCat("Stage ", i % 7, " sends activations to stage ", (i + 1) % 7,
                         ". Bubbles waste time! ");
  }
  return std::vector<int64_t>(text.begin(), text.end());
}

LlamaConfig TinyLlama(bool tied) {
  return {.vocab_size = 300,
          .context_length = 8,
          .width = 16,
          .num_heads = 4,
          .num_kv_heads = 2,
          .num_layers = 4,
          .intermediate_size = 24,
          .rope_theta = 500.0,
          .tie_embeddings = tied};
}

struct Case {
  RunConfig config;
  bool tied;
  std::string name;
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  auto add = [&](const std::string& schedule, int pp, int dp, int chunks, bool tied) {
    RunConfig c;
    c.schedule = schedule;
    c.pp = pp;
    c.dp = dp;
    c.chunks = chunks;
    c.microbatches = 4;
    c.steps = 3;
    c.optimizer.name = "adamw";
    c.optimizer.lr = 0.01;
    c.optimizer.weight_decay = 0.01;
    c.specs = [tied] { return *MakeLlamaSpecs(TinyLlama(tied)); };
    c.loss = LlamaLoss;
    c.source = [dp, m = c.microbatches]() -> std::unique_ptr<MicroBatchSource> {
      return std::make_unique<LmBatchSource>(*LmBatchSource::Create(
          Tokens(),
          {.seq_len = 8, .micro_batch_size = 2, .num_microbatches = m, .dp_size = dp, .seed = 7}));
    };
    c.partition_method = "type:LlamaBlock";
    cases.push_back(
        {c, tied,
         absl::StrCat(tied ? "tied_" : "untied_", schedule, "_pp", pp, "_dp", dp, "_v", chunks)});
  };
  for (bool tied : {false, true}) {
    add("1f1b", 1, 1, 1, tied);
    add("1f1b", 2, 1, 1, tied);
    add("gpipe", 2, 1, 1, tied);
    add("interleaved_1f1b", 2, 1, 2, tied);
  }
  add("1f1b", 2, 2, 1, /*tied=*/false);
  // Tensor parallelism at tp 2 (query heads 4 -> 2, kv heads 2 -> 1, the
  // SwiGLU and the vocabulary split), covering (pp, tp, dp) = (1,2,1) untied,
  // (2,2,1) tied under interleaved 1F1B, (2,2,2) untied, and with sequence
  // parallelism (2,2,1) untied 1F1B and (2,2,1) tied GPipe; SGD with momentum
  // (model_equivalence_test says why not AdamW).
  for (const auto& [schedule, pp, dp, chunks, tied, sp] :
       {std::tuple<std::string, int, int, int, bool, bool>{"1f1b", 1, 1, 1, false, false},
        {"interleaved_1f1b", 2, 1, 2, true, false},
        {"1f1b", 2, 2, 1, false, false},
        {"1f1b", 2, 1, 1, false, true},
        {"gpipe", 2, 1, 1, true, true}}) {
    add(schedule, pp, dp, chunks, tied);
    Case& c = cases.back();
    c.config.tp = 2;
    c.config.sequence_parallel = sp;
    c.config.optimizer.name = "sgd";
    c.config.optimizer.lr = 0.1;
    c.config.optimizer.momentum = 0.9;
    c.config.optimizer.weight_decay = 0;
    const int64_t vocab = TinyLlama(tied).vocab_size;
    c.config.parallel_loss = [vocab](const ModelParallelGroup& group) -> LossFn {
      return [vocab, group](const Activations& outputs, const MicroBatch& batch) {
        return LlamaParallelLoss(outputs, batch, vocab, group);
      };
    };
    c.name = (sp ? "tp2_sp_" : "tp2_") + c.name;
  }
  return cases;
}

class LlamaEquivalenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaEquivalenceTest, PipelineEqualsSequential) {
  const RunConfig& config = GetParam().config;
  absl::StatusOr<RunResult> pipeline = TrainPipeline(config);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  absl::StatusOr<RunResult> sequential = TrainSequential(config);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  EXPECT_EQ(CompareResults(*sequential, *pipeline, kRtol), "");
  // Tied: one table under its tie name; untied: no tied parameters at all.
  int tied_params = 0;
  for (const auto& [name, value] : pipeline->params) tied_params += name.rfind("tied.", 0) == 0;
  EXPECT_EQ(tied_params, GetParam().tied ? 1 : 0);
  EXPECT_LT(pipeline->losses.back(), pipeline->losses.front());
}

INSTANTIATE_TEST_SUITE_P(Schedules, LlamaEquivalenceTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace pp
