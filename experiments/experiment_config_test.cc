#include "experiments/experiment_config.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "pipeline/schedule/registry.h"

namespace pp {
namespace {

// GPipe with the backward split into I then W: valid and lowerable, but the
// runtime cannot execute I/W yet.
absl::StatusOr<Schedule> MakeSplitGPipe(const ScheduleOptions& options) {
  Schedule schedule = EmptyLoopedSchedule("split_gpipe_for_test", options);
  for (int r = 0; r < options.num_stages; ++r) {
    for (int mb = 0; mb < options.num_microbatches; ++mb) schedule.ranks[r].push_back(F(r, mb));
    for (int mb = 0; mb < options.num_microbatches; ++mb) {
      schedule.ranks[r].push_back(I(r, mb));
      schedule.ranks[r].push_back(W(r, mb));
    }
  }
  return schedule;
}
PP_REGISTER_SCHEDULE("split_gpipe_for_test", "GPipe with I/W, for the capability check",
                     MakeSplitGPipe);

ExperimentConfig Shipped(const std::string& name) {
  absl::StatusOr<ExperimentConfig> config = LoadExperimentConfig("experiments/configs/" + name);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ExperimentConfig();
}

ExperimentConfig Gpt() {
  ExperimentConfig config = Shipped("gpt_small_pp2.textproto");
  ResolveDefaults(config, ModelKind::kGpt);
  return config;
}

// The message of validating `config` (as train_gpt would, on `world` ranks).
std::string Error(const ExperimentConfig& config, int world = 2, ModelKind kind = ModelKind::kGpt) {
  absl::Status s = ValidateExperimentConfig(config, kind, world);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST(ExperimentConfigTest, EveryShippedConfigIsValid) {
  for (const auto& entry : std::filesystem::directory_iterator("experiments/configs")) {
    SCOPED_TRACE(entry.path().string());
    absl::StatusOr<ExperimentConfig> config = LoadExperimentConfig(entry.path().string());
    ASSERT_TRUE(config.ok()) << config.status();
    const ModelKind kind = config->has_bert() ? ModelKind::kBert : ModelKind::kGpt;
    ResolveDefaults(*config, kind);
    const int world = config->parallelism().pp() * config->parallelism().dp();
    EXPECT_TRUE(ValidateExperimentConfig(*config, kind, world).ok())
        << ValidateExperimentConfig(*config, kind, world);
  }
}

TEST(ExperimentConfigTest, MainConfigIsASmallGptOnTwoStagesWith1F1B) {
  ExperimentConfig c = Gpt();
  EXPECT_TRUE(c.has_gpt());
  EXPECT_EQ(c.parallelism().pp(), 2);
  EXPECT_EQ(c.parallelism().dp(), 1);
  EXPECT_EQ(c.parallelism().schedule(), "1f1b");
  EXPECT_EQ(c.data().path(), "/usr/share/common-licenses");
}

TEST(ExperimentConfigTest, ResolvedTextHasEveryFieldAndRoundTrips) {
  ExperimentConfig c;
  ResolveDefaults(c, ModelKind::kBert);
  const std::string text = ConfigToText(c);
  EXPECT_HAS(text, "mask_prob: 0.15");
  EXPECT_HAS(text, "save_interval: 0");
  EXPECT_HAS(text, "schedule: \"1f1b\"");
  absl::StatusOr<ExperimentConfig> again = ParseExperimentConfig(text);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ConfigToText(*again), text);
}

TEST(ExperimentConfigTest, OverridesSetSingleFields) {
  ExperimentConfig c = Gpt();
  ASSERT_TRUE(ApplyOverride(c, "parallelism.pp=4").ok());
  ASSERT_TRUE(ApplyOverride(c, "optimizer.lr=1e-4").ok());
  ASSERT_TRUE(ApplyOverride(c, "data.path=/tmp/some \"text\"").ok());
  ASSERT_TRUE(ApplyOverride(c, "checkpoint.resume=runs/x/step_100").ok());
  ASSERT_TRUE(ApplyOverride(c, "gpt.num_layers=8").ok());
  EXPECT_EQ(c.parallelism().pp(), 4);
  EXPECT_EQ(c.parallelism().schedule(), "1f1b");  // siblings kept
  EXPECT_DOUBLE_EQ(c.optimizer().lr(), 1e-4);
  EXPECT_EQ(c.data().path(), "/tmp/some \"text\"");
  EXPECT_EQ(c.checkpoint().resume(), "runs/x/step_100");
  EXPECT_EQ(c.gpt().num_layers(), 8);
  EXPECT_EQ(c.gpt().width(), 128);
}

TEST(ExperimentConfigTest, BadOverridesSayWhatIsValid) {
  ExperimentConfig c = Gpt();
  std::string m(ApplyOverride(c, "parallelism.stages=4").message());
  EXPECT_HAS(m, "has no field 'stages'");
  EXPECT_HAS(m, "pp, dp, schedule");
  m = std::string(ApplyOverride(c, "parallelism=4").message());
  EXPECT_HAS(m, "is a message");
  m = std::string(ApplyOverride(c, "steps").message());
  EXPECT_HAS(m, "field.path=value");
  m = std::string(ApplyOverride(c, "steps=many").message());
  EXPECT_HAS(m, "cannot set steps to 'many'");
}

TEST(ExperimentConfigTest, ParseErrorsNameTheLine) {
  std::string m(ParseExperimentConfig("steps: 3\nparallelism { pipes: 2 }\n").status().message());
  EXPECT_HAS(m, "line 2");
  EXPECT_HAS(m, "pipes");
  EXPECT_EQ(LoadExperimentConfig("/nonexistent.textproto").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ExperimentConfigTest, RanksMustEqualPpTimesDp) {
  EXPECT_HAS(Error(Gpt(), 3),
             "parallelism.pp (2) x parallelism.dp (1) = 2 ranks, but 3 were started");
  EXPECT_TRUE(
      ValidateExperimentConfig(Gpt(), ModelKind::kGpt, 0).ok());  // launcher side: not known yet
}

TEST(ExperimentConfigTest, MicroBatchCountTheScheduleRejects) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_schedule("interleaved_1f1b");
  c.mutable_parallelism()->set_chunks(2);
  c.mutable_parallelism()->set_num_microbatches(3);
  const std::string m = Error(c);
  EXPECT_HAS(m,
             "parallelism.schedule 'interleaved_1f1b' rejects pp=2, num_microbatches=3, chunks=2");
}

// A schedule the runtime cannot execute is refused at validation (exit 2,
// before any worker starts), naming the schedule and the action.
TEST(ExperimentConfigTest, ScheduleTheRuntimeCannotExecute) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_schedule("split_gpipe_for_test");
  const std::string m = Error(c);
  EXPECT_HAS(m, "parallelism.schedule: schedule 'split_gpipe_for_test' uses 0I0 on rank 0");
  EXPECT_HAS(m, "split backward");
}

TEST(ExperimentConfigTest, MoreStagesThanBlocks) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_pp(8);
  EXPECT_HAS(
      Error(c, 8),
      "parallelism.pp (8) x parallelism.chunks (1) = 8 model parts, but the model has only 4 "
      "blocks (gpt.num_layers)");
}

TEST(ExperimentConfigTest, UnknownScheduleListsTheValidNames) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_schedule("zigzag");
  const std::string m = Error(c);
  EXPECT_HAS(m, "parallelism.schedule 'zigzag' is not a registered schedule; valid: ");
  EXPECT_HAS(m, "1f1b");
  EXPECT_HAS(m, "gpipe");
  c.mutable_parallelism()->set_schedule("inference");
  EXPECT_HAS(Error(c), "forward-only");
}

TEST(ExperimentConfigTest, UnknownPartitionMethodListsTheValidNames) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_partition_method("balanced");
  std::string m = Error(c);
  EXPECT_HAS(m, "parallelism.partition_method 'balanced' is unknown; valid: ");
  EXPECT_HAS(m, "uniform");
  EXPECT_HAS(m, "type");
  c.mutable_parallelism()->set_partition_method("type:NoSuchLayer");
  EXPECT_HAS(Error(c), "cannot cut the gpt into 2 parts");
}

TEST(ExperimentConfigTest, OtherBadFieldsAreNamed) {
  ExperimentConfig c = Gpt();
  c.mutable_gpt()->set_num_heads(3);
  EXPECT_HAS(Error(c), "gpt.width (128) must be a multiple of gpt.num_heads (3)");
  c = Gpt();
  c.mutable_parallelism()->set_num_microbatches(0);
  EXPECT_HAS(Error(c), "parallelism.num_microbatches (0) must be at least 1");
  c = Gpt();
  c.mutable_optimizer()->set_name("lion");
  EXPECT_HAS(Error(c), "lion");
  c = Gpt();
  c.set_steps(10);
  EXPECT_HAS(Error(c), "lr_schedule.warmup_steps must be below steps");
  c = Gpt();
  c.mutable_data()->set_path("/no/such/corpus");
  EXPECT_HAS(Error(c), "data.path '/no/such/corpus' does not exist");
  c = Gpt();
  c.set_sample_top_k(0);
  EXPECT_HAS(Error(c), "sample_top_k (0)");
  c = Gpt();
  c.mutable_checkpoint()->set_keep_last(-1);
  EXPECT_HAS(Error(c), "checkpoint.keep_last (-1) must not be negative");
}

TEST(ExperimentConfigTest, ModelKindMustMatchTheBinary) {
  EXPECT_HAS(Error(Gpt(), 2, ModelKind::kBert), "run it with //experiments:train_gpt");
  ExperimentConfig bert = Shipped("bert_small_pp2.textproto");
  ResolveDefaults(bert, ModelKind::kBert);
  EXPECT_HAS(Error(bert, 2, ModelKind::kGpt), "run it with //experiments:train_bert");
}

// A user's model (ModelKind::kCustom): no gpt/bert section, and the stage
// count is checked against its own layers.
TEST(ExperimentConfigTest, CustomModelIsValidatedAgainstItsSpecs) {
  const std::vector<LayerSpec> specs(
      3, LayerSpec("Identity", [] { return MakeModuleLayer(torch::nn::Identity()); }));
  ExperimentConfig c;
  c.mutable_parallelism()->set_pp(2);
  ResolveDefaults(c, ModelKind::kCustom);
  EXPECT_FALSE(c.has_gpt() || c.has_bert());
  EXPECT_EQ(c.parallelism().partition_method(), "uniform");
  absl::Status ok = ValidateExperimentConfig(c, ModelKind::kCustom, 2, &specs);
  EXPECT_TRUE(ok.ok()) << ok;
  c.mutable_parallelism()->set_pp(4);
  absl::Status s = ValidateExperimentConfig(c, ModelKind::kCustom, 4, &specs);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(std::string(s.message()),
             "parallelism.pp (4) x parallelism.chunks (1) = 4 model parts, but the model has only "
             "3 layers");
  absl::Status gpt = ValidateExperimentConfig(Gpt(), ModelKind::kCustom, 2, &specs);
  EXPECT_EQ(gpt.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(std::string(gpt.message()), "run it with //experiments:train_gpt");
  EXPECT_EQ(ValidateExperimentConfig(c, ModelKind::kCustom, 4).code(),
            absl::StatusCode::kInternal);  // specs are required
}

}  // namespace
}  // namespace pp
