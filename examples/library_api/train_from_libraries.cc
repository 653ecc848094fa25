// A pipeline training run composed from pipe's library targets alone, without
// its driver: the launcher and rendezvous, the process topology and grid, the
// reference GPT's layer specs, a partitioner, activation checkpointing, a
// registered schedule, the Trainer and training checkpoints. What a
// researcher's own trainer looks like when it needs a loop pipe's driver does
// not have (examples/README.md, "Building on the libraries").
//
//   ./bazelw run //examples/library_api:train_from_libraries -- --steps=30
//       --checkpoint_dir=/tmp/library_api_ckpt
//
// (one command line, wrapped without a backslash, which gcc warns about in a
// comment.)
//
// Two ranks (two pipeline stages) on this machine. It trains, saves a
// checkpoint, takes one more step, loads the checkpoint back and checks that
// the step taken again is the same, bit for bit.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/model/trainer_checkpoint.h"
#include "common/status_macros.h"
#include "models/gpt/gpt.h"
#include "pipeline/autograd/activation_checkpointing.h"
#include "pipeline/partition/partitioner.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/micro_batch_source.h"
#include "pipeline/runtime/optimizer.h"
#include "pipeline/runtime/trainer.h"
#include "topology/launcher.h"
#include "topology/parallel_grid.h"
#include "topology/process_topology.h"
#include "topology/rendezvous.h"

ABSL_FLAG(int, steps, 30, "training steps before the checkpoint");
ABSL_FLAG(std::string, checkpoint_dir, "", "where the checkpoint is written (required)");
ABSL_FLAG(std::string, partition, "parameters", "a registered partition method");
ABSL_FLAG(std::string, schedule, "1f1b", "a registered training schedule");

namespace pp {
namespace {

constexpr int kStages = 2;
constexpr int kMicroBatches = 4;
constexpr int64_t kBatch = 2;

// The hyperparameters are the model's config message (models/gpt/gpt_config.proto),
// the one a driver run reads from `model { [pp.gpt] { ... } }`.
GptModelConfig ExampleGpt() {
  GptModelConfig gpt;
  gpt.set_vocab_size(32);
  gpt.set_context_length(16);
  gpt.set_width(32);
  gpt.set_num_heads(2);
  gpt.set_num_layers(4);
  return gpt;
}

// Token sequences that count upwards modulo the vocabulary from a start drawn
// from (step, index): a GPT learns the rule within a few dozen steps.
class CountingSource : public MicroBatchSource {
 public:
  explicit CountingSource(const GptModelConfig& gpt) : gpt_(gpt) {}

  absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override {
    torch::Generator gen =
        at::detail::createCPUGenerator(static_cast<uint64_t>(step * 1000 + index + 1));
    const torch::Tensor starts = torch::randint(gpt_.vocab_size(), {kBatch, 1}, gen, torch::kLong);
    const torch::Tensor tokens =
        (starts + torch::arange(gpt_.context_length() + 1, torch::kLong)) % gpt_.vocab_size();
    MicroBatchData data;
    data.inputs = {tokens.slice(1, 0, gpt_.context_length())};
    data.batch.id = step * kMicroBatches + index;
    data.batch.tensors["labels"] = tokens.slice(1, 1, gpt_.context_length() + 1);
    return data;
  }

 private:
  GptModelConfig gpt_;
};

// This rank's stage of the GPT, cut by `partition` into kStages parts.
absl::StatusOr<std::unique_ptr<PipelineModel>> BuildStage(const std::vector<LayerSpec>& specs,
                                                          const ParallelGrid& grid) {
  PipelineModelOptions options;
  options.num_stages = kStages;
  options.partition_method = absl::GetFlag(FLAGS_partition);
  options.base_seed = 1234;
  return PipelineModel::Create(specs, options, grid.stage_id());
}

absl::StatusOr<std::unique_ptr<Trainer>> BuildTrainer(ParallelGrid& grid, PipelineModel& model,
                                                      MicroBatchSource& source) {
  TrainerOptions options;
  options.schedule = absl::GetFlag(FLAGS_schedule);
  options.num_microbatches = kMicroBatches;
  options.optimizer = OptimizerConfig{.name = "adamw", .lr = 1e-2};
  options.max_grad_norm = 1.0;
  // Every transformer block recomputes its activations in the backward pass.
  PP_ASSIGN_OR_RETURN(
      options.layer_runner,
      MakeCheckpointingRunner({.interval = 1, .checkpointable_types = "TransformerBlock"}));
  return Trainer::Create(&grid, &model, GptLoss, &source, options);
}

absl::Status Run() {
  const std::string checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  if (checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("--checkpoint_dir is required (a folder to write into)");
  }
  PP_ASSIGN_OR_RETURN(const ProcessTopology topology, PipeDataParallelTopology(kStages, 1));
  PP_ASSIGN_OR_RETURN(World world, RendezvousFromEnv({.timeout = std::chrono::seconds(120)}));
  PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, topology));
  const bool printer = grid.global_rank() == 0;

  const GptModelConfig gpt = ExampleGpt();
  PP_ASSIGN_OR_RETURN(const std::vector<LayerSpec> specs, MakeGptSpecs(gpt));
  PartitionRequest request{.specs = &specs, .num_parts = kStages, .base_seed = 1234};
  PP_ASSIGN_OR_RETURN(const Bounds bounds, Partition(absl::GetFlag(FLAGS_partition), request));
  if (printer) std::printf("%s", PartitionReport(specs, bounds, kStages).c_str());

  CountingSource source(gpt);
  PP_ASSIGN_OR_RETURN(std::unique_ptr<PipelineModel> model, BuildStage(specs, grid));
  PP_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, BuildTrainer(grid, *model, source));
  double first_loss = 0;
  for (int step = 0; step < absl::GetFlag(FLAGS_steps); ++step) {
    PP_ASSIGN_OR_RETURN(const StepResult r, trainer->Step());
    if (step == 0) first_loss = r.loss;
    if (printer && (step % 10 == 0 || step + 1 == absl::GetFlag(FLAGS_steps))) {
      std::printf("step %d loss %.4f\n", step + 1, r.loss);
    }
  }
  PP_ASSIGN_OR_RETURN(const std::string saved,
                      SaveTrainingCheckpoint({.root = checkpoint_dir, .owner = "library_api"}, grid,
                                             *model, *trainer));

  // One more step, then back to the checkpoint (weights, optimizer state,
  // step, RNG) and the same step again: a resume takes it bit for bit alike.
  PP_ASSIGN_OR_RETURN(const StepResult next, trainer->Step());
  PP_RETURN_IF_ERROR(LoadTrainingCheckpoint(saved, grid, *model, *trainer).status());
  PP_ASSIGN_OR_RETURN(const StepResult next_resumed, trainer->Step());
  if (printer) {
    std::printf("first loss %.4f, last loss %.4f\n", first_loss, next.loss);
    std::printf("checkpoint %s: the resumed step %lld has loss %.9g, the original %.9g (%s)\n",
                saved.c_str(), static_cast<long long>(next_resumed.step + 1), next_resumed.loss,
                next.loss, next_resumed.loss == next.loss ? "equal" : "DIFFERENT");
    std::fflush(stdout);
  }
  if (next_resumed.loss != next.loss || next_resumed.grad_norm != next.grad_norm) {
    return absl::InternalError(
        absl::StrFormat("the step after loading the checkpoint differs: loss %.9g vs %.9g, "
                        "gradient norm %.9g vs %.9g",
                        next_resumed.loss, next.loss, next_resumed.grad_norm, next.grad_norm));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  pp::MaybeLaunch(argc, argv, [] { return pp::kStages; });
  if (absl::Status status = pp::Run(); !status.ok()) {
    std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
