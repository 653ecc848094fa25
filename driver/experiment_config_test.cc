#include "driver/experiment_config.h"
#include "driver/resume_config.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/field_checks.h"
#include "common/torch_compat.h"
#include "driver/testdata/test_blocks.pb.h"
#include "models/bert/bert_config.pb.h"
#include "models/gpt/gpt_config.pb.h"
#include "models/registry.h"
#include "pipeline/layers/layer.h"
#include "pipeline/schedule/schedules/registry.h"
#include "topology/device.h"
#include "topology/host_staged_backend.h"
#include "topology/worker_resources.h"

namespace pp {
namespace {

// GPipe with the backward split into I then W: valid and lowerable; the
// runtime's capability check (run by config validation) accepts I/W.
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

// A model of `layers` identity layers (testdata/test_blocks.proto).
PP_REGISTER_MODEL(
    TestBlocksConfig, test_blocks,
    {
        .name = "test_blocks",
        .description = "identity layers, for the driver's checks",
        .data_sources = {},
        .validate =
            [](const TestBlocksConfig& c, const ModelRun&) {
              return CheckIntField("test_blocks.layers", c.layers(), 1, 1000);
            },
        .specs = [](const TestBlocksConfig& c) -> absl::StatusOr<std::vector<LayerSpec>> {
          return std::vector<LayerSpec>(c.layers(), LayerSpec("Identity", [](const LayerContext&) {
                                          return MakeModuleLayer(torch::nn::Identity());
                                        }));
        },
        .loss = [](const Activations& outputs, const MicroBatch&) { return outputs.at(0).sum(); },
        .data = [](const TestBlocksConfig&, const ModelRun&) -> absl::StatusOr<ModelData> {
          return absl::UnimplementedError("not trained in this test");
        },
    });

ExperimentConfig Testdata(const std::string& name) {
  absl::StatusOr<ExperimentConfig> config = LoadExperimentConfig("driver/testdata/" + name);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ExperimentConfig();
}

const GptModelConfig& GptOf(const ExperimentConfig& c) { return c.model().GetExtension(gpt); }
GptModelConfig* MutableGpt(ExperimentConfig& c) { return c.mutable_model()->MutableExtension(gpt); }

ExperimentConfig Gpt() {
  ExperimentConfig config = Testdata("gpt_pp2.textproto");
  ResolveDefaults(config);
  return config;
}

// The message of validating `config` (as train_gpt would, on `world` ranks).
std::string Error(const ExperimentConfig& config, int world = 2) {
  absl::Status s = ValidateExperimentConfig(config, world);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST(ExperimentConfigTest, ResolvedTextHasEveryFieldAndRoundTrips) {
  ExperimentConfig c;
  c.mutable_model()->MutableExtension(bert);
  ResolveDefaults(c);
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
  EXPECT_EQ(GptOf(c).num_layers(), 8);
  EXPECT_EQ(GptOf(c).width(), 128);
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

// Issue #42 class 9: --precision=fp32 --set=precision=bf16 trained fp32 and
// --steps=4 --set=steps=2 four steps. Any field given twice on the command
// line (a flag and --set, or two --set) is refused naming both.
TEST(ExperimentConfigTest, AFieldGivenTwiceIsRefusedNamingBoth) {
  EXPECT_TRUE(CheckOneValuePerField({{"--steps=4", "steps=4"},
                                     {"--set=precision=bf16", "precision=bf16"},
                                     {"--set=gpt.width=64", "gpt.width=64"}})
                  .ok());
  EXPECT_EQ(CheckOneValuePerField({{"--set=precision=bf16", "precision=bf16"},
                                   {"--precision=fp32", "precision=fp32"}})
                .message(),
            "config field 'precision' is given twice, by --set=precision=bf16 and by "
            "--precision=fp32; only one would be taken, so give it once");
  EXPECT_HAS(std::string(
                 CheckOneValuePerField({{"--set=steps=2", "steps=2"}, {"--set=steps=2", "steps=2"}})
                     .message()),
             "config field 'steps' is given twice");
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
  EXPECT_TRUE(ValidateExperimentConfig(Gpt(), 0).ok());  // launcher side: not known yet
}

TEST(ExperimentConfigTest, PpTimesDpBeyondInt32IsRefused) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_pp(65536);
  c.mutable_parallelism()->set_dp(65536);
  // Refused by its range before any product is formed.
  EXPECT_HAS(Error(c, 0), "parallelism.pp (65536) must be at most 1024");
  c.mutable_parallelism()->set_pp(2);
  EXPECT_HAS(Error(c, 0), "parallelism.dp (65536) must be at most 1024");
}

// Tensor parallelism (issue #38): world = pp x dp x tp; the model must
// support it and its sizes divide; the planner-based parts refuse it by name.
TEST(ExperimentConfigTest, TensorParallelRunsAreCheckedBeforeLaunch) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_tp(2);
  EXPECT_TRUE(ValidateExperimentConfig(c, 4).ok()) << ValidateExperimentConfig(c, 4);
  EXPECT_EQ(WorldSizeOf(c.parallelism()), 4);
  EXPECT_HAS(Error(c, 2),
             "parallelism.pp (2) x parallelism.dp (1) x parallelism.tp (2) = 4 "
             "ranks, but 2 were started");
  EXPECT_EQ(ModelRunOf(c).tp, 2);

  ExperimentConfig heads = c;
  MutableGpt(heads)->set_num_heads(2);
  heads.mutable_parallelism()->set_tp(4);
  EXPECT_HAS(Error(heads, 8), "gpt.num_heads (2) must be a multiple of parallelism.tp (4)");
  ExperimentConfig dropout = c;  // each rank keeps its slice of the dense mask
  MutableGpt(dropout)->set_dropout(0.1);
  EXPECT_TRUE(ValidateExperimentConfig(dropout, 4).ok());

  ExperimentConfig too_many = c;
  too_many.mutable_parallelism()->set_tp(65);
  EXPECT_HAS(Error(too_many, 0), "parallelism.tp (65) must be at most 64");
  too_many.mutable_parallelism()->set_tp(64);
  too_many.mutable_parallelism()->set_dp(1024);
  MutableGpt(too_many)->set_num_heads(64);  // divides by tp = 64
  EXPECT_HAS(Error(too_many, 0), "= 131072 ranks; at most 65536 are supported");

  ExperimentConfig sp = c;  // sequence parallelism: tp > 1 and a sequence tp divides
  sp.mutable_parallelism()->set_sequence_parallel(true);
  EXPECT_TRUE(ValidateExperimentConfig(sp, 4).ok()) << ValidateExperimentConfig(sp, 4);
  EXPECT_TRUE(ModelRunOf(sp).sequence_parallel);
  MutableGpt(sp)->set_context_length(63);
  EXPECT_HAS(Error(sp, 4),
             "gpt.context_length (63) must be a multiple of parallelism.tp (2) with "
             "parallelism.sequence_parallel");
  sp.mutable_parallelism()->set_tp(1);
  EXPECT_HAS(Error(sp, 2), "parallelism.sequence_parallel needs parallelism.tp > 1");

  // The memory planner prices one rank of a model group, so auto and a
  // memory cap work with tp (a cap below that rank's peak is refused).
  ExperimentConfig auto_schedule = c;
  auto_schedule.mutable_parallelism()->set_schedule("auto");
  EXPECT_TRUE(ValidateExperimentConfig(auto_schedule, 4).ok())
      << ValidateExperimentConfig(auto_schedule, 4);
  ExperimentConfig capped = c;
  capped.mutable_parallelism()->set_memory_cap_mib(1024);
  EXPECT_TRUE(ValidateExperimentConfig(capped, 4).ok()) << ValidateExperimentConfig(capped, 4);
  capped.mutable_parallelism()->set_memory_cap_mib(0.01);
  EXPECT_HAS(Error(capped, 4), "parallelism.memory_cap_mib=0.01: pipeline rank ");

  // A model whose registration declares no tensor_parallel_loss.
  ExperimentConfig blocks = c;
  blocks.clear_model();
  blocks.mutable_model()->MutableExtension(test_blocks)->set_layers(4);
  const std::string e = Error(blocks, 4);
  EXPECT_HAS(e,
             "parallelism.tp (2) > 1, but model 'test_blocks' does not support tensor "
             "parallelism");
  EXPECT_HAS(e, "a model that does: bert, gpt");
}

// parallelism.vocab_parallel: GPT's split validates under 1F1B (the passes
// placed) and under zbv_vocab; a vocabulary schedule without it, a model
// without a vocabulary split and what it cannot do yet are refused by name.
TEST(ExperimentConfigTest, VocabParallel) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_vocab_parallel(true);
  EXPECT_TRUE(ValidateExperimentConfig(c, 2).ok()) << ValidateExperimentConfig(c, 2);
  ExperimentConfig v = c;
  v.mutable_parallelism()->set_schedule("zbv_vocab");
  v.mutable_parallelism()->set_chunks(2);
  EXPECT_TRUE(ValidateExperimentConfig(v, 2).ok()) << ValidateExperimentConfig(v, 2);
  v.mutable_parallelism()->set_vocab_parallel(false);
  EXPECT_HAS(Error(v, 2), "parallelism.schedule 'zbv_vocab' has vocabulary passes");

  ExperimentConfig sampling = c;
  sampling.set_sample_tokens(10);
  EXPECT_TRUE(ValidateExperimentConfig(sampling, 2).ok()) << ValidateExperimentConfig(sampling, 2);
  ExperimentConfig sharded = c;
  sharded.mutable_parallelism()->set_dp(2);
  sharded.mutable_parallelism()->set_distributed_optimizer(true);
  EXPECT_TRUE(ValidateExperimentConfig(sharded, 4).ok()) << ValidateExperimentConfig(sharded, 4);

  // On a GPU (the shards on each rank's device): only the device's own
  // check may refuse it, here by its missing GPUs.
  ExperimentConfig gpu = c;
  gpu.mutable_parallelism()->set_device("cuda");
  gpu.mutable_parallelism()->set_ranks_per_device(2);
  if (absl::Status s = ValidateExperimentConfig(gpu, 2); !s.ok()) {
    const std::string m(s.message());
    EXPECT_EQ(m.find("vocab"), std::string::npos) << m;
    EXPECT_HAS(m, "parallelism.device 'cuda'");
  } else {
    EXPECT_GE(VisibleCudaDevices(), 1);
  }

  ExperimentConfig blocks = c;
  blocks.clear_model();
  blocks.mutable_model()->MutableExtension(test_blocks)->set_layers(4);
  const std::string e = Error(blocks, 2);
  EXPECT_HAS(e, "model 'test_blocks' does not support vocabulary parallelism");
  EXPECT_HAS(e, "a model that does: gpt");
}

// parallelism.vocab_barriers: 1 places the one-barrier passes into any
// schedule without its own (zb_h1, interleaved 1F1B, auto's measurement
// schedule); -1, 3, set without vocab_parallel, or contradicting a
// registered schedule's own form are refused naming the value and what is
// valid. 0 (the default, which the config's defaults fill in) is pipe's
// choice: a registered schedule keeps its own form.
TEST(ExperimentConfigTest, VocabBarriers) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_vocab_parallel(true);
  c.mutable_parallelism()->set_vocab_barriers(1);
  for (const auto& [schedule, chunks] :
       {std::pair{"1f1b", 1}, std::pair{"zb_h1", 1}, std::pair{"interleaved_1f1b", 2},
        std::pair{"auto", 1}, std::pair{"1f1b_vocab1", 1}, std::pair{"zbv_vocab1", 2}}) {
    ExperimentConfig v = c;
    v.mutable_parallelism()->set_schedule(schedule);
    v.mutable_parallelism()->set_chunks(chunks);
    EXPECT_TRUE(ValidateExperimentConfig(v, 2).ok())
        << schedule << ": " << ValidateExperimentConfig(v, 2);
  }
  for (int bad : {-1, 3}) {
    ExperimentConfig v = c;
    v.mutable_parallelism()->set_vocab_barriers(bad);
    EXPECT_HAS(Error(v, 2), absl::StrCat("parallelism.vocab_barriers (", bad,
                                         ") must be 1 (the one-barrier output algorithm) or 2"));
  }
  ExperimentConfig dense = c;
  dense.mutable_parallelism()->set_vocab_parallel(false);
  EXPECT_HAS(Error(dense, 2),
             "parallelism.vocab_barriers (1) is set without parallelism.vocab_parallel");
  ExperimentConfig two = c;
  two.mutable_parallelism()->set_schedule("1f1b_vocab");
  EXPECT_HAS(Error(two, 2),
             "parallelism.schedule '1f1b_vocab' has its own vocabulary passes with 2 barriers, "
             "but parallelism.vocab_barriers is 1");
  ExperimentConfig one = c;
  one.mutable_parallelism()->set_schedule("zbv_vocab1");
  one.mutable_parallelism()->set_chunks(2);
  one.mutable_parallelism()->set_vocab_barriers(2);
  EXPECT_HAS(Error(one, 2),
             "parallelism.schedule 'zbv_vocab1' has its own vocabulary passes with 1 barrier, "
             "but parallelism.vocab_barriers is 2");
  // 0, a registered schedule keeps its own form.
  one.mutable_parallelism()->set_vocab_barriers(0);
  EXPECT_TRUE(ValidateExperimentConfig(one, 2).ok()) << ValidateExperimentConfig(one, 2);
}

// parallelism.vocab_async_collectives: accepted with vocab_parallel under
// any training schedule (both output algorithms), refused without it,
// naming the value and the fix.
TEST(ExperimentConfigTest, VocabAsyncCollectives) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_vocab_parallel(true);
  c.mutable_parallelism()->set_vocab_async_collectives(true);
  for (const auto& [schedule, chunks] : {std::pair{"1f1b", 1}, std::pair{"1f1b_vocab1", 1},
                                         std::pair{"zbv_vocab", 2}, std::pair{"auto", 1}}) {
    ExperimentConfig v = c;
    v.mutable_parallelism()->set_schedule(schedule);
    v.mutable_parallelism()->set_chunks(chunks);
    EXPECT_TRUE(ValidateExperimentConfig(v, 2).ok())
        << schedule << ": " << ValidateExperimentConfig(v, 2);
  }
  ExperimentConfig dense = c;
  dense.mutable_parallelism()->set_vocab_parallel(false);
  const std::string e = Error(dense, 2);
  EXPECT_HAS(e,
             "parallelism.vocab_async_collectives (true) is set without "
             "parallelism.vocab_parallel");
  EXPECT_HAS(e, "set vocab_parallel=true, or drop vocab_async_collectives");
  dense.mutable_parallelism()->set_vocab_async_collectives(false);
  EXPECT_TRUE(ValidateExperimentConfig(dense, 2).ok()) << ValidateExperimentConfig(dense, 2);
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

// Config validation runs the runtime's capability check (a schedule it cannot
// execute would be refused before any worker starts; the refusal itself is
// tested in //pipeline/schedule/ir:capabilities_test). I/W schedules pass it, and a
// schedule's own option rules (zbv: two chunks) still apply.
TEST(ExperimentConfigTest, SplitBackwardSchedulesPassTheCapabilityCheck) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_schedule("split_gpipe_for_test");
  EXPECT_TRUE(ValidateExperimentConfig(c, 2).ok()) << ValidateExperimentConfig(c, 2);
  c.mutable_parallelism()->set_schedule("zbv");
  EXPECT_HAS(Error(c), "num_chunks (1) must be 2");
  c.mutable_parallelism()->set_chunks(2);
  EXPECT_TRUE(ValidateExperimentConfig(c, 2).ok()) << ValidateExperimentConfig(c, 2);
}

// parallelism.device: an unknown name lists the valid ones; cuda names the
// missing device (no CUDA in the build, no GPU, too few GPUs), and is valid
// where every local rank has its GPU.
TEST(ExperimentConfigTest, DeviceIsKnownAndPresent) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_device("gpu");
  EXPECT_HAS(Error(c), "parallelism.device: device 'gpu' is not a known device; valid: cpu, cuda");
  c.mutable_parallelism()->set_device("cuda");
  const int gpus = VisibleCudaDevices();
  if (gpus >= 2) {
    absl::Status s = ValidateExperimentConfig(c, 2);
    EXPECT_TRUE(s.ok()) << s;
    return;
  }
  const std::string m = Error(c);
  if (gpus < 2) {
    EXPECT_HAS(m, "parallelism.device 'cuda' (pp x dp = 2 ranks on this node): ");
  }
  if (!torch_compat::BuiltWithCuda()) {
    EXPECT_HAS(m, "device cuda:0 (--device=cuda, local rank 0) is not available");
    EXPECT_HAS(m, "built without CUDA; build with --config=cuda");
  } else if (gpus == 0) {
    EXPECT_HAS(m, "device cuda:0 (--device=cuda, local rank 0) is not available");
    EXPECT_HAS(m, "no CUDA GPU is visible");
  } else {
    EXPECT_HAS(m, "device cuda:1 (--device=cuda, local rank 1) is not available");
  }
}

TEST(ExperimentConfigTest, RanksPerDeviceNeedsCudaAndGpusForEveryGroupOfRanks) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_ranks_per_device(0);
  EXPECT_HAS(Error(c), "parallelism.ranks_per_device");
  c.mutable_parallelism()->set_ranks_per_device(2);
  EXPECT_HAS(Error(c),
             "parallelism.ranks_per_device = 2 shares GPUs between ranks and needs "
             "parallelism.device 'cuda'; with device 'cpu' leave it at 1");
  c.mutable_parallelism()->set_device("cuda");
  if (VisibleCudaDevices() >= 1 && HostStagedBackendAvailable()) {
    absl::Status s = ValidateExperimentConfig(c, 2);
    EXPECT_TRUE(s.ok()) << s;
    return;
  }
  const std::string m = Error(c);
  // Both ranks would be on cuda:0; the refusal names it and the setting.
  EXPECT_HAS(m,
             "parallelism.device 'cuda' (pp x dp = 2 ranks on this node, "
             "parallelism.ranks_per_device = 2): ");
  EXPECT_HAS(m, "device cuda:0 (--device=cuda, local rank 0) is not available");
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
  MutableGpt(c)->set_num_heads(3);
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

// parallelism.auto_costs: only with schedule auto, and a cost string the
// synthesiser can use.
TEST(ExperimentConfigTest, AutoCostsAreCheckedBeforeLaunch) {
  ExperimentConfig c = Gpt();
  c.mutable_parallelism()->set_auto_costs("F:1,I:1,W:1");
  EXPECT_HAS(Error(c),
             "parallelism.auto_costs ('F:1,I:1,W:1') is for parallelism.schedule "
             "'auto' (the schedule is '1f1b')");
  c.mutable_parallelism()->set_schedule("auto");
  EXPECT_TRUE(ValidateExperimentConfig(c, 2).ok()) << ValidateExperimentConfig(c, 2);
  c.mutable_parallelism()->set_auto_costs("F:1,Q:2");
  EXPECT_HAS(Error(c), "parallelism.auto_costs 'F:1,Q:2': ");
  c.mutable_parallelism()->set_auto_costs("F:0,B:2");
  EXPECT_HAS(Error(c), "parallelism.auto_costs 'F:0,B:2' needs F > 0 and B > 0");
}

// Found only after the workers had started (issue 29): each is refused by
// validation now, naming the value and what is valid.
TEST(ExperimentConfigTest, WhatFailedOnlyInTheWorkersIsRefusedBeforeLaunch) {
  // --name=../../escape/x wrote outside output_dir; 300 characters exceeded
  // a file name.
  for (const std::string& name : {std::string("../../escape/x"), std::string("a/b"),
                                  std::string(".hidden"), std::string(""), std::string(300, 'n')}) {
    SCOPED_TRACE(name);
    ExperimentConfig c = Gpt();
    c.set_name(name);
    const std::string error = Error(c);
    EXPECT_HAS(error, absl::StrCat("characters) is not a run name: valid are 1 to 128 letters, "
                                   "digits, '_', '-' and '.'"));
    EXPECT_HAS(error, absl::StrCat("(", name.size(), " characters)"));
  }
  {
    ExperimentConfig c = Gpt();
    c.set_name("../../escape/x");
    EXPECT_HAS(Error(c), "name '../../escape/x' (14 characters)");
  }
  for (const std::string& name : {std::string("gpt_small_pp2"), std::string("run-1.b"),
                                  std::string("_x"), std::string(128, 'n')}) {
    ExperimentConfig c = Gpt();
    c.set_name(name);
    EXPECT_TRUE(ValidateExperimentConfig(c, 2).ok()) << name << ValidateExperimentConfig(c, 2);
  }
  // checkpointable_types: a regex that does not compile, and one matching
  // no layer (it silently turned recomputation off).
  ExperimentConfig c = Gpt();
  ASSERT_TRUE(ApplyOverride(c, "parallelism.activation_checkpointing.interval=1").ok());
  ASSERT_TRUE(ApplyOverride(c, "parallelism.activation_checkpointing.checkpointable_types=[").ok());
  std::string error = Error(c);
  EXPECT_HAS(error,
             "parallelism.activation_checkpointing.checkpointable_types '[' does not compile as "
             "an ECMAScript regex");
  EXPECT_HAS(error, "GptEmbedding, TransformerBlock, FinalLayerNorm, LmHead");
  ASSERT_TRUE(ApplyOverride(c,
                            "parallelism.activation_checkpointing.checkpointable_types="
                            "NoSuchLayer")
                  .ok());
  error = Error(c);
  EXPECT_HAS(error,
             "checkpointable_types 'NoSuchLayer' matches none of this model's layer types "
             "(GptEmbedding, TransformerBlock, FinalLayerNorm, LmHead), so activation "
             "checkpointing (interval 1) would recompute nothing");
  ASSERT_TRUE(ApplyOverride(c,
                            "parallelism.activation_checkpointing.checkpointable_types="
                            "TransformerBlock")
                  .ok());
  EXPECT_TRUE(ValidateExperimentConfig(c, 2).ok()) << ValidateExperimentConfig(c, 2);
  // Off (interval 0): the regex is not used, so not checked.
  ASSERT_TRUE(ApplyOverride(c, "parallelism.activation_checkpointing.interval=0").ok());
  ASSERT_TRUE(
      ApplyOverride(c, "parallelism.activation_checkpointing.checkpointable_types=Nothing").ok());
  EXPECT_TRUE(ValidateExperimentConfig(c, 2).ok());

  // --partition=profile:garbage (profile times layers in the workers only).
  c = Gpt();
  c.mutable_parallelism()->set_partition_method("profile:garbage");
  error = Error(c);
  EXPECT_HAS(error, "parallelism.partition_method 'profile:garbage' cannot cut the gpt");
  EXPECT_HAS(error, "unknown argument 'garbage'; valid: 'profile' or 'profile:cap_mib=N");
  c.mutable_parallelism()->set_partition_method("profile:cap_mib=100");
  EXPECT_HAS(Error(c), "needs the micro-batches in flight of each of the 2 parts");
  for (const char* ok : {"profile", "profile:cap_mib=100,in_flight=2/1"}) {
    c.mutable_parallelism()->set_partition_method(ok);
    EXPECT_TRUE(ValidateExperimentConfig(c, 2).ok()) << ok << ValidateExperimentConfig(c, 2);
  }

  // --set=sample_prompt= with sampling on failed after the whole training.
  c = Gpt();
  ASSERT_TRUE(ApplyOverride(c, "sample_prompt=").ok());
  EXPECT_HAS(Error(c), "sample_prompt is empty, but sample_tokens (");
  ASSERT_TRUE(ApplyOverride(c, "sample_tokens=0").ok());
  EXPECT_TRUE(ValidateExperimentConfig(c, 2).ok());

  // --resume=/nonexistent failed in every worker.
  c = Gpt();
  c.mutable_checkpoint()->set_resume("/nonexistent");
  EXPECT_HAS(Error(c),
             "checkpoint.resume '/nonexistent' does not exist; valid: a checkpoint "
             "directory (step_N)");
  c.mutable_checkpoint()->set_resume("auto");
  EXPECT_TRUE(ValidateExperimentConfig(c, 2).ok());
  c.mutable_checkpoint()->set_resume("/dev/null");
  EXPECT_HAS(Error(c), "checkpoint.resume '/dev/null' is not a directory");

  // BERT's masked-LM samples need 8 positions ([CLS] A [SEP] B [SEP]).
  ExperimentConfig bert = Testdata("bert_pp2.textproto");
  ResolveDefaults(bert);
  ASSERT_TRUE(ApplyOverride(bert, "bert.context_length=7").ok());
  EXPECT_HAS(Error(bert), "bert.context_length (7) must be at least 8");

  // BERT splits over tp (heads and MLP hidden must divide), with sequence
  // parallelism when the context length divides too.
  ASSERT_TRUE(ApplyOverride(bert, "bert.context_length=16").ok());
  bert.mutable_parallelism()->set_tp(2);
  EXPECT_TRUE(ValidateExperimentConfig(bert, 4).ok()) << ValidateExperimentConfig(bert, 4);
  bert.mutable_parallelism()->set_tp(3);
  EXPECT_HAS(Error(bert, 6), "must be a multiple of parallelism.tp (3)");
  bert.mutable_parallelism()->set_tp(2);
  bert.mutable_parallelism()->set_sequence_parallel(true);
  EXPECT_TRUE(ValidateExperimentConfig(bert, 4).ok()) << ValidateExperimentConfig(bert, 4);
  ASSERT_TRUE(ApplyOverride(bert, "bert.context_length=17").ok());
  EXPECT_HAS(Error(bert, 4), "bert.context_length (17) must be a multiple of parallelism.tp (2)");
}

// Every numeric field has a checked range, named in the error: values that
// used to train garbage with exit 0 or crash a worker (issue #14).
TEST(ExperimentConfigTest, EveryNumericFieldIsRangeChecked) {
  struct Case {
    std::string assignment;  // applied to the shipped gpt_small_pp2
    std::string message;
  };
  const std::vector<Case> cases = {
      {"optimizer.lr=inf", "optimizer.lr (inf) must be finite and in (0, 10]"},
      {"optimizer.lr=1e30", "optimizer.lr (1e+30) must be finite and in (0, 10]"},
      {"optimizer.lr=0", "optimizer.lr (0) must be finite and in (0, 10]"},
      {"optimizer.lr=-1", "optimizer.lr (-1)"},
      {"lr_schedule.min_lr=-0.1", "lr_schedule.min_lr (-0.1) must be finite and in [0, 0.003]"},
      {"lr_schedule.min_lr=0.01", "lr_schedule.min_lr (0.01) must be finite and in [0, 0.003]"},
      {"optimizer.max_grad_norm=nan",
       "optimizer.max_grad_norm (nan) must be finite and >= 0 (0 = no clipping)"},
      {"optimizer.max_grad_norm=-1", "optimizer.max_grad_norm (-1)"},
      {"optimizer.eps=1e400", "optimizer.eps (inf) must be finite and in (0, 1)"},
      {"optimizer.eps=-1e-8", "optimizer.eps (-1e-08)"},
      {"optimizer.eps=nan", "optimizer.eps (nan)"},
      {"optimizer.beta1=1", "optimizer.beta1 (1) must be finite and in [0, 1)"},
      {"optimizer.beta2=1.57", "optimizer.beta2 (1.57) must be finite and in [0, 1)"},
      {"optimizer.momentum=-0.5", "optimizer.momentum (-0.5)"},
      {"optimizer.weight_decay=inf", "optimizer.weight_decay (inf)"},
      {"log_interval=0", "log_interval (0) must be at least 1"},
      {"steps=0", "steps (0) must be at least 1"},
      {"eval_batches=0", "eval_batches (0) must be at least 1"},
      {"eval_interval=-1", "eval_interval (-1) must not be negative"},
      {"trace_step=-1", "trace_step (-1) must not be negative"},
      {"trace_steps=0", "trace_steps (0) must be at least 1"},
      {"sample_tokens=-5", "sample_tokens (-5) must not be negative and at most 1000000"},
      {"sample_temperature=nan", "sample_temperature (nan)"},
      {"parallelism.num_microbatches=1000000000",
       "parallelism.num_microbatches (1000000000) must be at most 65536"},
      {"parallelism.micro_batch_size=-2", "parallelism.micro_batch_size (-2) must be at least 1"},
      {"parallelism.dp=0", "parallelism.dp (0) must be at least 1 and at most 1024"},
      {"parallelism.chunks=1000", "parallelism.chunks (1000) must be at most 64"},
      {"parallelism.timeout_seconds=0", "parallelism.timeout_seconds (0) must be at least 1"},
      {"parallelism.transport_thread_nice=20",
       "parallelism.transport_thread_nice (20) must be at most 19"},
      {"parallelism.transport_thread_nice=-1",
       "parallelism.transport_thread_nice (-1) must not be negative"},
      {"gpt.num_layers=100000000", "gpt.num_layers (100000000) must be at most 100000"},
      {"gpt.num_layers=0", "gpt.num_layers (0) must be at least 1"},
      {"gpt.width=-128", "gpt.width (-128) must be at least 1"},
      {"gpt.num_heads=0", "gpt.num_heads (0) must be at least 1"},
      {"gpt.num_heads=256", "gpt.num_heads (256) must be at most 128 (at most width)"},
      {"gpt.context_length=10000000", "gpt.context_length (10000000) must be at most 65536"},
      {"gpt.mlp_ratio=0", "gpt.mlp_ratio (0)"},
      {"gpt.dropout=nan", "gpt.dropout (nan) must be finite and in [0, 1)"},
      {"gpt.dropout=1", "gpt.dropout (1)"},
      {"data.eval_fraction=0.5", "data.eval_fraction (0.5) must be finite and in [0, 0.5)"},
      {"lr_schedule.warmup_steps=-1", "lr_schedule.warmup_steps (-1) must not be negative"},
      // At most 4 threads per core of this machine (issue 29, finding 4).
      {"threads.intra_op=-1",
       absl::StrCat("threads.intra_op (-1) must not be negative and at most ", MaxWorkerThreads())},
      {"threads.intra_op=4096",
       absl::StrCat("threads.intra_op (4096) must be at most ", MaxWorkerThreads(),
                    " (0 = the launcher's choice; at most 4 per core of this machine)")},
      {"threads.blas=100000",
       absl::StrCat("threads.blas (100000) must be at most ", MaxWorkerThreads())},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.assignment);
    ExperimentConfig config = Gpt();
    ASSERT_TRUE(ApplyOverride(config, c.assignment).ok());
    EXPECT_HAS(Error(config), c.message);
  }
  // A constant schedule never reaches min_lr: only its sign is checked.
  ExperimentConfig constant = Gpt();
  ASSERT_TRUE(ApplyOverride(constant, "lr_schedule.name=constant").ok());
  ASSERT_TRUE(ApplyOverride(constant, "lr_schedule.min_lr=0.01").ok());
  EXPECT_TRUE(ValidateExperimentConfig(constant, 2).ok());
  // The edges that are valid.
  ExperimentConfig edges = Gpt();
  for (const char* a : {"optimizer.lr=10", "lr_schedule.min_lr=0", "optimizer.max_grad_norm=0",
                        "optimizer.beta1=0", "log_interval=1", "optimizer.eps=0.5"}) {
    ASSERT_TRUE(ApplyOverride(edges, a).ok());
  }
  EXPECT_TRUE(ValidateExperimentConfig(edges, 2).ok()) << ValidateExperimentConfig(edges, 2);
}

// data.source picks the corpus or the peer benchmark's synthetic rows; the
// synthetic source needs no corpus, is GPT's only, and a typo lists both.
TEST(ExperimentConfigTest, DataSourceIsCorpusOrSynthetic) {
  ExperimentConfig c = Gpt();
  ASSERT_TRUE(ApplyOverride(c, "data.source=synthetic").ok());
  c.mutable_data()->set_path("/no/such/corpus");
  EXPECT_TRUE(ValidateExperimentConfig(c, 2).ok()) << ValidateExperimentConfig(c, 2);
  c.mutable_data()->set_source("random");
  EXPECT_HAS(Error(c), "data.source 'random' is unknown; valid: corpus, synthetic");
  ExperimentConfig bert = Testdata("bert_pp2.textproto");
  ResolveDefaults(bert);
  bert.mutable_data()->set_source("synthetic");
  EXPECT_HAS(Error(bert),
             "data.source 'synthetic' is not one that model 'bert' reads; valid here: corpus");
}

// A model too big for the machine is refused with the estimate, before the
// specs or the schedule are built.
TEST(ExperimentConfigTest, ModelBeyondMemoryIsRefusedNamingTheEstimate) {
  ExperimentConfig c = Gpt();
  MutableGpt(c)->set_num_layers(50000);
  MutableGpt(c)->set_width(8192);
  MutableGpt(c)->set_num_heads(64);
  c.mutable_parallelism()->set_partition_method("uniform");
  EXPECT_HAS(Error(c), "the run needs an estimated ");
}

TEST(ExperimentConfigTest, ConfigThatIsADirectoryIsRefused) {
  absl::StatusOr<ExperimentConfig> c = LoadExperimentConfig("driver/testdata");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(std::string(c.status().message()),
             "config 'driver/testdata' is not a regular file (a directory)");
  c = LoadExperimentConfig("/dev/null");
  EXPECT_HAS(std::string(c.status().message()), "config '/dev/null' is not a regular file");
  EXPECT_EQ(LoadExperimentConfig("/no/such.textproto").status().code(),
            absl::StatusCode::kNotFound);
}

// The model is the config's one extension of ModelConfig, registered in the
// binary (here gpt, bert and the test model below).
TEST(ExperimentConfigTest, ModelIsNamedOnceAndRegistered) {
  ExperimentConfig none = Gpt();
  none.clear_model();
  EXPECT_HAS(Error(none),
             "the config names no model; set model { [pp.<model>] { ... } } with one "
             "of the models linked into this binary: bert, gpt, test_blocks");
  ExperimentConfig both = Gpt();
  both.mutable_model()->MutableExtension(bert);
  EXPECT_HAS(Error(both), "the config's model section sets pp.gpt and pp.bert; set exactly one");
  absl::StatusOr<ExperimentConfig> unknown =
      ParseExperimentConfig("model { [pp.no_such_model] { } }");
  EXPECT_HAS(std::string(unknown.status().message()),
             "(models linked into this binary: bert, gpt, test_blocks)");
  EXPECT_EQ(FindModel("gpt")->default_partition_method, "type:TransformerBlock");
}

// A model registered outside pipe (here: in this test) gets the same checks,
// its stage count against its own layers and its own default partition.
TEST(ExperimentConfigTest, RegisteredModelIsValidatedAgainstItsSpecs) {
  ExperimentConfig c = Gpt();
  c.clear_model();
  c.mutable_parallelism()->clear_partition_method();
  c.mutable_model()->MutableExtension(test_blocks);
  ResolveDefaults(c);
  EXPECT_EQ(c.model().GetExtension(test_blocks).layers(), 3);  // the .proto's default
  EXPECT_EQ(c.parallelism().partition_method(), "uniform");
  absl::Status ok = ValidateExperimentConfig(c, 2);
  EXPECT_TRUE(ok.ok()) << ok;
  c.mutable_parallelism()->set_pp(4);
  EXPECT_HAS(Error(c, 4),
             "parallelism.pp (4) x parallelism.chunks (1) = 4 model parts, but the model has only "
             "3 layers");
  ASSERT_TRUE(ApplyOverride(c, "test_blocks.layers=0").ok());
  EXPECT_HAS(Error(c, 4), "test_blocks.layers (0) must be at least 1");
}

// Issue #14: resuming with another num_heads, seed or optimizer was accepted
// silently. Every difference is named, field by field.
TEST(ResumeConfigTest, DifferencesAreNamedFieldByField) {
  const ExperimentConfig saved = Gpt();
  const std::string saved_text = ConfigToText(saved);
  std::vector<std::string> warnings;
  // The same config (and one differing only in what does not change the
  // training) resumes silently.
  ExperimentConfig same = saved;
  same.set_name("other");
  same.set_log_interval(3);
  same.mutable_checkpoint()->set_resume("auto");
  same.set_output_dir("/elsewhere");
  EXPECT_TRUE(CheckResumeConfig(saved_text, same, &warnings).ok());
  EXPECT_TRUE(warnings.empty()) << warnings.front();

  ExperimentConfig changed = saved;
  MutableGpt(changed)->set_num_heads(GptOf(saved).num_heads() * 2);
  changed.set_seed(saved.seed() + 1);
  changed.mutable_optimizer()->set_name("sgd");
  changed.mutable_optimizer()->set_lr(saved.optimizer().lr() / 2);
  changed.mutable_parallelism()->set_pp(4);
  changed.set_steps(saved.steps() + 10);
  absl::Status s = CheckResumeConfig(saved_text, changed, &warnings);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  for (const std::string& want :
       {absl::StrCat("gpt.num_heads: ", GptOf(saved).num_heads(), " in the checkpoint, ",
                     GptOf(saved).num_heads() * 2, " now"),
        absl::StrCat("seed: ", saved.seed(), " in the checkpoint, ", saved.seed() + 1, " now"),
        std::string("optimizer.name: \"adamw\" in the checkpoint, \"sgd\" now"),
        std::string("checkpoint.allow_config_change=true")}) {
    EXPECT_NE(s.message().find(want), std::string::npos) << want << " not in: " << s;
  }
  // Allowed differences are warnings, one per field.
  std::string all = absl::StrJoin(warnings, "\n");
  EXPECT_EQ(warnings.size(), 3u) << all;
  EXPECT_NE(all.find("optimizer.lr: "), std::string::npos) << all;
  EXPECT_NE(all.find("parallelism.pp: 2 in the checkpoint, 4 now"), std::string::npos) << all;
  EXPECT_NE(all.find("steps: "), std::string::npos) << all;

  // checkpoint.allow_config_change turns the errors into warnings.
  warnings.clear();
  changed.mutable_checkpoint()->set_allow_config_change(true);
  EXPECT_TRUE(CheckResumeConfig(saved_text, changed, &warnings).ok());
  EXPECT_EQ(warnings.size(), 6u) << absl::StrJoin(warnings, "\n");

  // A BERT checkpoint resumed as GPT: the model kind is named.
  ExperimentConfig bert = saved;
  bert.clear_model();
  bert.mutable_model()->MutableExtension(pp::bert);
  ResolveDefaults(bert);
  warnings.clear();
  s = CheckResumeConfig(ConfigToText(bert), saved, &warnings);
  EXPECT_NE(s.message().find("model: bert in the checkpoint, gpt now"), std::string::npos) << s;

  // Another tensor-parallel size: the shards are merged and split again, a
  // warning saying so.
  ExperimentConfig tp = saved;
  tp.mutable_parallelism()->set_tp(2);
  warnings.clear();
  EXPECT_TRUE(CheckResumeConfig(saved_text, tp, &warnings).ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("resuming at another tensor-parallel size (parallelism.tp: 1 in the "
                             "checkpoint, 2 now): the checkpoint's shards are merged"),
            std::string::npos)
      << warnings[0];

  // No config, or one that does not parse: a warning, not a silent pass.
  warnings.clear();
  EXPECT_TRUE(CheckResumeConfig("", saved, &warnings).ok());
  EXPECT_TRUE(CheckResumeConfig("no_such_field: 1", saved, &warnings).ok());
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("records no experiment config"), std::string::npos);
  EXPECT_NE(warnings[1].find("does not parse"), std::string::npos);
}

}  // namespace
}  // namespace pp
