// GPT under vocabulary parallelism beside the Trainer's other parts: what
// the Trainer and the checkpoints refuse, by name, instead of running wrong,
// and what a checkpoint's table file holds. (The training itself:
// //models/equivalence:vocab_equivalence_test; resuming and resharding:
// //models/gpt:trainer_checkpoint_test.)
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "checkpoint/model/checkpoint_dir.h"
#include "checkpoint/model/tensor_file.h"
#include "checkpoint/model/trainer_checkpoint.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "models/config_testing.h"
#include "models/data/lm_data.h"
#include "models/gpt/gpt.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/model_parallel_group.h"
#include "pipeline/runtime/trainer.h"
#include "pipeline/runtime/vocab_layers.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

constexpr std::chrono::seconds kTimeout{30};

GptModelConfig TinyGpt() {
  return ParseModelConfig<GptModelConfig>(
      "vocab_size: 64 context_length: 8 width: 16 num_heads: 2 num_layers: 2");
}

std::unique_ptr<LmBatchSource> Source() {
  std::vector<int64_t> tokens;
  for (int i = 0; i < 400; ++i) tokens.push_back((i * 7) % 64);
  return std::make_unique<LmBatchSource>(*LmBatchSource::Create(
      tokens, {.seq_len = 8, .micro_batch_size = 2, .num_microbatches = 2, .dp_size = 1}));
}

// This rank's stage of two and its rows of the table split over them.
struct VocabStage {
  std::unique_ptr<PipelineModel> model;
  std::unique_ptr<VocabularyLayers> vocabulary;
  std::unique_ptr<LmBatchSource> source = Source();
  TrainerOptions options;  // two micro-batches, the vocabulary's
};
absl::StatusOr<VocabStage> MakeVocabStage(ParallelGrid& grid) {
  PP_ASSIGN_OR_RETURN(VocabularySplit split, MakeGptVocabularySplit(TinyGpt()));
  PipelineModelOptions mo;
  mo.num_stages = 2;
  mo.partition_method = "type:TransformerBlock";
  VocabStage stage;
  PP_ASSIGN_OR_RETURN(stage.model, PipelineModel::Create(split.body, mo, grid.stage_id()));
  PP_ASSIGN_OR_RETURN(stage.vocabulary,
                      MakeVocabularyLayers(split, mo.base_seed, PipeGroupOf(grid, kTimeout)));
  stage.options.num_microbatches = 2;
  stage.options.executor.p2p.timeout = kTimeout;
  stage.options.vocabulary = stage.vocabulary.get();
  return stage;
}

// Two stages, the table split over them; `check` gets each rank's Trainer
// after one step. `dense_names`: the layers know the split's dense names
// (MakeVocabularyLayers), else they are built from the tables alone.
absl::Status WithVocabTrainer(
    bool dense_names,
    const std::function<absl::Status(ParallelGrid&, PipelineModel&, Trainer&)>& check) {
  return RunOnGrid(2, 1, kTimeout, [&](ParallelGrid& grid) -> absl::Status {
    PP_ASSIGN_OR_RETURN(VocabStage stage, MakeVocabStage(grid));
    if (!dense_names) {
      // A table of zeros: only the names matter here.
      stage.vocabulary = std::make_unique<VocabularyLayers>(
          torch::zeros({64, 16}), torch::Tensor(), /*tied=*/true, PipeGroupOf(grid, kTimeout));
      stage.options.vocabulary = stage.vocabulary.get();
    }
    PP_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(&grid, stage.model.get(), GptLoss,
                                                      stage.source.get(), stage.options));
    PP_RETURN_IF_ERROR(trainer->Step().status());
    return check(grid, *stage.model, *trainer);
  });
}

// A checkpoint holds the tables under the dense model's names: vocabulary
// layers that do not know them (built from tables, not from a split) are
// refused, by name, rather than saved under made-up names.
TEST(VocabTrainerTest, CheckpointsNeedTheDenseNames) {
  const std::string root =
      (std::filesystem::path(testing::TempDir()) / "vocab_checkpoint").string();
  absl::Status s = WithVocabTrainer(
      /*dense_names=*/false, [&](ParallelGrid& grid, PipelineModel& model, Trainer& trainer) {
        TrainingCheckpointOptions options;
        options.root = root;
        absl::StatusOr<std::string> saved = SaveTrainingCheckpoint(options, grid, model, trainer);
        EXPECT_EQ(saved.status().code(), absl::StatusCode::kFailedPrecondition) << saved.status();
        EXPECT_NE(saved.status().message().find("have no dense layout"), std::string::npos)
            << saved.status();
        absl::StatusOr<LoadReport> loaded = LoadTrainingCheckpoint(root, grid, model, trainer);
        EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition) << loaded.status();
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// Saved with the dense names, the table's file holds the whole table once,
// written by pipe rank 0 beside the positions it shares a module with.
TEST(VocabTrainerTest, CheckpointHoldsTheWholeTableOnce) {
  const std::string root =
      (std::filesystem::path(testing::TempDir()) / "vocab_checkpoint_whole").string();
  std::filesystem::remove_all(root);
  absl::Status s = WithVocabTrainer(
      /*dense_names=*/true, [&](ParallelGrid& grid, PipelineModel& model, Trainer& trainer) {
        TrainingCheckpointOptions options;
        options.root = root;
        return SaveTrainingCheckpoint(options, grid, model, trainer).status();
      });
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<TensorDict> tied = ReadTensorFileUnchecked(root + "/" + CheckpointName(1) + "/" +
                                                            TiedFileName("embed", 0, 1, "model"));
  ASSERT_TRUE(tied.ok()) << tied.status();
  std::vector<std::string> names;
  for (const auto& [name, t] : *tied) {
    names.push_back(name);
    if (name == "tok_embed.weight") {
      EXPECT_EQ(t.sizes(), (std::vector<int64_t>{64, 16}));
    }
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"pos_embed.weight", "tok_embed.weight"}));
}

// A schedule with vocabulary passes needs the vocabulary layers.
TEST(VocabTrainerTest, VocabularyScheduleWithoutLayersIsRefused) {
  absl::Status s = RunOnGrid(2, 1, kTimeout, [&](ParallelGrid& grid) -> absl::Status {
    PP_ASSIGN_OR_RETURN(VocabularySplit split, MakeGptVocabularySplit(TinyGpt()));
    PipelineModelOptions mo;
    mo.num_stages = 2;
    PP_ASSIGN_OR_RETURN(auto model, PipelineModel::Create(split.body, mo, grid.stage_id()));
    std::unique_ptr<LmBatchSource> source = Source();
    TrainerOptions to;
    to.schedule = "1f1b_vocab";
    to.num_microbatches = 2;
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create(&grid, model.get(), GptLoss, source.get(), to);
    EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument) << trainer.status();
    EXPECT_NE(trainer.status().message().find(
                  "has vocabulary passes but the run has no vocabulary layers"),
              std::string::npos)
        << trainer.status();
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// The shards live on the run's device (VocabularyLayers::to, as
// PipelineModel::to moves a stage): moved, they keep their rows and stay
// trainable leaves; left elsewhere, the Trainer refuses them by name (here
// on the meta device, since this machine may have no GPU).
TEST(VocabTrainerTest, ShardsMustBeOnTheRunsDevice) {
  absl::Status s = RunOnGrid(2, 1, kTimeout, [&](ParallelGrid& grid) -> absl::Status {
    PP_ASSIGN_OR_RETURN(VocabStage stage, MakeVocabStage(grid));
    VocabularyLayers* vocabulary = stage.vocabulary.get();
    const torch::Tensor rows = vocabulary->embedding().detach().clone();
    vocabulary->to(torch::kCPU);
    EXPECT_TRUE(torch::equal(vocabulary->embedding(), rows));
    EXPECT_TRUE(vocabulary->embedding().is_leaf());
    EXPECT_TRUE(vocabulary->embedding().requires_grad());

    vocabulary->to(torch::kMeta);
    EXPECT_TRUE(vocabulary->embedding().is_meta());
    EXPECT_TRUE(vocabulary->embedding().requires_grad());
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create(&grid, stage.model.get(), GptLoss, stage.source.get(), stage.options);
    EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument) << trainer.status();
    EXPECT_NE(trainer.status().message().find(
                  "TrainerOptions::executor.p2p.device is cpu but the vocabulary shards"),
              std::string::npos)
        << trainer.status();
    EXPECT_NE(trainer.status().message().find("are on meta; move them first "
                                              "(VocabularyLayers::to)"),
              std::string::npos)
        << trainer.status();
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace pp
