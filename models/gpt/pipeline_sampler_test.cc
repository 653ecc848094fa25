#include "models/gpt/pipeline_sampler.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/status_macros.h"
#include "models/config_testing.h"
#include "models/data/lm_data.h"
#include "models/gpt/gpt.h"
#include "models/gpt/sample.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/model_parallel_group.h"
#include "pipeline/runtime/vocab_layers.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

constexpr uint64_t kSeed = 77;

GptModelConfig Tiny() {
  return ParseModelConfig<GptModelConfig>(
      "vocab_size: 260 context_length: 8 width: 16 num_heads: 2 num_layers: 4");
}

std::vector<int64_t> Prompt() { return {'T', 'h', 'e'}; }

// The sequential model's generation: the reference.
std::vector<int64_t> SequentialSample(const SampleOptions& options) {
  StageModule model = *BuildSequential(*MakeGptSpecs(Tiny()), kSeed);
  torch::NoGradGuard no_grad;
  return *Generate(Prompt(), 8, options, [&](const torch::Tensor& window, int64_t position) {
    MicroBatch batch;
    batch.tensors["input_ids"] = window;
    return absl::StatusOr<torch::Tensor>(model->Forward({window}, batch)[0][0][position]);
  });
}

// Every rank's generation through a pp-stage pipeline (its evaluation
// program); `vocab`: the table split over the pipe ranks (the logits
// gathered from every rank's rows).
std::vector<std::vector<int64_t>> PipelineSample(int pp, const SampleOptions& options,
                                                 bool vocab = false) {
  std::mutex mu;
  std::vector<std::vector<int64_t>> per_rank(pp);
  const std::chrono::milliseconds timeout(std::chrono::seconds(30));
  absl::Status status = RunOnGrid(pp, 1, timeout, [&](ParallelGrid& grid) -> absl::Status {
    PipelineModelOptions mo;
    mo.num_stages = pp;
    mo.partition_method = "type:TransformerBlock";
    mo.base_seed = kSeed;
    PP_ASSIGN_OR_RETURN(const VocabularySplit split, MakeGptVocabularySplit(Tiny()));
    PP_ASSIGN_OR_RETURN(
        auto model, PipelineModel::Create(vocab ? split.body : split.dense, mo, grid.stage_id()));
    std::unique_ptr<VocabularyLayers> vocabulary;
    if (vocab) {
      PP_ASSIGN_OR_RETURN(vocabulary,
                          MakeVocabularyLayers(split, kSeed, PipeGroupOf(grid, timeout)));
    }
    std::string text(200, 'a');
    PP_ASSIGN_OR_RETURN(
        LmBatchSource source,
        LmBatchSource::Create(std::vector<int64_t>(text.begin(), text.end()),
                              {.seq_len = 8, .micro_batch_size = 2, .num_microbatches = 2}));
    PipelineSampler sampler;
    TrainerOptions to;
    to.schedule = "1f1b";
    to.num_microbatches = 2;
    to.executor.p2p.timeout = timeout;
    to.vocabulary = vocabulary.get();
    PP_ASSIGN_OR_RETURN(
        auto trainer, Trainer::Create(&grid, model.get(), sampler.WrapLoss(GptLoss), &source, to));
    PP_ASSIGN_OR_RETURN(
        std::vector<int64_t> tokens,
        Generate(Prompt(), 8, options, sampler.LogitsFn(trainer.get(), &grid, 260, timeout)));
    std::lock_guard<std::mutex> lock(mu);
    per_rank[grid.global_rank()] = tokens;
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return per_rank;
}

TEST(PipelineSamplerTest, GreedyAndTopKThroughTwoStagesEqualTheSequentialModel) {
  for (const SampleOptions& options :
       {SampleOptions{.num_tokens = 12, .top_k = 1},
        SampleOptions{.num_tokens = 12, .top_k = 5, .temperature = 2.0, .seed = 3}}) {
    const std::vector<int64_t> want = SequentialSample(options);
    ASSERT_EQ(want.size(), 15u);
    for (int64_t token : want) EXPECT_LT(token, 256);
    for (const std::vector<int64_t>& got : PipelineSample(2, options)) EXPECT_EQ(got, want);
    for (const std::vector<int64_t>& got : PipelineSample(2, options, /*vocab=*/true)) {
      EXPECT_EQ(got, want) << "vocabulary parallel";
    }
  }
}

}  // namespace
}  // namespace pp
