// LLaMA in the runtime's equivalence proof: trained as a pipeline (pp 1 and 2,
// several schedules, data parallelism, tied and untied heads, grouped-query
// attention) it gives the losses, grad norms and final weights of
// ToSequential() trained on the same batches.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "models/config_testing.h"
#include "models/data/lm_data.h"
#include "models/llama/llama.h"
#include "pipeline/runtime/equivalence_testing.h"
#include "pipeline/schedule/schedules/registry.h"
#include "pipeline/tensor_parallel/planted_fault.h"

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

LlamaModelConfig TinyLlama(bool tied, int64_t kv_heads = 2) {
  LlamaModelConfig c = ParseModelConfig<LlamaModelConfig>(
      "vocab_size: 300 context_length: 8 width: 16 num_heads: 4 num_layers: 4 "
      "intermediate_size: 24 rope_theta: 500.0");
  c.set_num_kv_heads(kv_heads);
  c.set_tie_embeddings(tied);
  return c;
}

struct Case {
  RunConfig config;
  bool tied;
  std::string name;
};

// A tensor-parallel case's optimizer and vocabulary-parallel loss (SGD with
// momentum: model_equivalence_test says why not AdamW).
void MakeTensorParallel(RunConfig& c, int tp, bool sequence_parallel, int64_t vocab) {
  c.tp = tp;
  c.sequence_parallel = sequence_parallel;
  c.optimizer.name = "sgd";
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.9;
  c.optimizer.weight_decay = 0;
  c.parallel_loss = [vocab](const ModelParallelGroup& group) -> LossFn {
    return [vocab, group](const Activations& outputs, const MicroBatch& batch) {
      return LlamaParallelLoss(outputs, batch, vocab, group);
    };
  };
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  auto add = [&](const std::string& schedule, int pp, int dp, int chunks, bool tied,
                 int64_t kv_heads = 2) {
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
    c.specs = [tied, kv_heads] { return *MakeLlamaSpecs(TinyLlama(tied, kv_heads)); };
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
    MakeTensorParallel(c.config, 2, sp, TinyLlama(tied).vocab_size());
    c.name = (sp ? "tp2_sp_" : "tp2_") + c.name;
  }
  // Fewer kv heads than tp: each kv head held by tp / kv_heads ranks, their
  // gradients summed. Multi-query attention (1 kv head) at (1,2,1) with
  // sequence parallelism; 2 kv heads at tp 4 (one query head per rank) at
  // (2,4,1) under zbv, whose W passes run the sums.
  for (const auto& [schedule, pp, tp, chunks, kv_heads, sp] :
       {std::tuple<std::string, int, int, int, int64_t, bool>{"1f1b", 1, 2, 1, 1, true},
        {"zbv", 2, 4, 2, 2, false}}) {
    add(schedule, pp, 1, chunks, /*tied=*/false, kv_heads);
    Case& c = cases.back();
    MakeTensorParallel(c.config, tp, sp, TinyLlama(false).vocab_size());
    c.name = absl::StrCat("tp", tp, sp ? "_sp" : "", "_kv", kv_heads, "_", c.name);
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

// Without summing the replicated kv heads' gradients (each holder learning
// only from its own query heads) the pipeline leaves the sequential run.
TEST(LlamaTensorParallelTest, AMissingReplicaGradientSumIsDetected) {
  RunConfig c = AllCases().front().config;
  c.specs = [] { return *MakeLlamaSpecs(TinyLlama(/*tied=*/false, /*kv_heads=*/1)); };
  c.steps = 2;
  MakeTensorParallel(c, 2, /*sequence_parallel=*/false, TinyLlama(false).vocab_size());
  absl::StatusOr<RunResult> sequential = TrainSequential(c);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  absl::StatusOr<RunResult> parallel = TrainPipeline(c);
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  EXPECT_EQ(CompareResults(*sequential, *parallel, kRtol), "");
  namespace tp_internal = tensor_parallel::internal;
  const tp_internal::PlantedFault previous =
      tp_internal::PlantFault(tp_internal::PlantedFault::kSkipReplicaGradientSum);
  absl::StatusOr<RunResult> broken = TrainPipeline(c);
  tp_internal::PlantFault(previous);
  ASSERT_TRUE(broken.ok()) << broken.status();
  EXPECT_NE(CompareResults(*sequential, *broken, kRtol), "");
}

INSTANTIATE_TEST_SUITE_P(Schedules, LlamaEquivalenceTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace pp
