// Benchmark: what splitting a stage's backward into I and W costs.
//
//   ./bazelw run //experiments:bench_split_backward -- --steps=30
//
// The stage is the last stage of the README's main command (train_gpt: a
// 4-block GPT, width 128, context 64, 8 sequences per micro-batch, pp = 2):
// blocks 2 and 3, the final norm, the tied LM head and the loss, fed hidden
// states that require grad (as a received activation does). Per repetition it
// runs forward, then either one full backward (B) or BackwardInput (I) and
// WeightGradTask::Run (W) (pipeline/runtime/split_backward.h), timing only the
// backward part. Variants alternate within each repetition (B, I+W, B, ...),
// so a noisy neighbour slows both alike; medians of wall time and minima of
// process CPU time are reported. The bar: time(I) + time(W) <=
// 1.15 x time(B). With --checkpoint every layer is a checkpointed range
// (interval 1; the forward recompute then sits in I). Prints a table and one JSON line.
#include <malloc.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/activation/activation_checkpointing.h"
#include "common/status_macros.h"
#include "experiments/bench_common.h"
#include "models/gpt/gpt.h"
#include "nlohmann/json.hpp"
#include "pipeline/layers/layer.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/split_backward.h"

ABSL_FLAG(int64_t, gpt_layers, 4,
          "transformer blocks of the whole model (the stage: the last half)");
ABSL_FLAG(int64_t, gpt_width, 128, "width");
ABSL_FLAG(int64_t, gpt_heads, 4, "attention heads");
ABSL_FLAG(int64_t, gpt_context, 64, "sequence length");
ABSL_FLAG(int64_t, gpt_batch, 8, "sequences per micro-batch");
ABSL_FLAG(bool, checkpoint, false, "checkpoint every layer of the stage (interval 1)");
ABSL_FLAG(int64_t, steps, 30, "measured repetitions per variant");
ABSL_FLAG(int64_t, warmup, 3, "unmeasured repetitions per variant");

namespace pp {
namespace {

double CpuMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

double WallMs(BenchClock::time_point a) {
  return std::chrono::duration<double, std::milli>(BenchClock::now() - a).count();
}

struct Samples {
  std::vector<double> wall, cpu;
  void Add(double w, double c) {
    wall.push_back(w);
    cpu.push_back(c);
  }
};

absl::Status Run() {
  const int threads = SetBenchThreads(1);
  // Keep freed memory mapped (like a caching allocator), so that both
  // variants time compute rather than page faults of re-mapped buffers.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  GptConfig config;
  config.num_layers = absl::GetFlag(FLAGS_gpt_layers);
  config.width = absl::GetFlag(FLAGS_gpt_width);
  config.num_heads = absl::GetFlag(FLAGS_gpt_heads);
  config.context_length = absl::GetFlag(FLAGS_gpt_context);
  config.dropout = 0.0;
  const int64_t batch = absl::GetFlag(FLAGS_gpt_batch);
  PP_ASSIGN_OR_RETURN(std::vector<LayerSpec> specs, MakeGptSpecs(config));
  PP_ASSIGN_OR_RETURN(StageModule sequential, BuildSequential(specs, /*base_seed=*/0));
  std::vector<Layer> layers = sequential->layers();
  // Layer 0 is the embedding, then the blocks: the stage starts at the block
  // the pp = 2 split of the blocks gives stage 1.
  const size_t first = 1 + static_cast<size_t>(config.num_layers / 2);
  std::vector<Layer> head(layers.begin(), layers.begin() + first);
  std::vector<Layer> stage(layers.begin() + first, layers.end());
  LayerRunner runner;
  if (absl::GetFlag(FLAGS_checkpoint)) {
    ActivationCheckpointPolicy policy;
    policy.interval = 1;
    PP_ASSIGN_OR_RETURN(runner, MakeCheckpointingRunner(policy));
  }
  torch::manual_seed(0);
  torch::Tensor tokens =
      torch::randint(config.vocab_size, {batch, config.context_length + 1}, torch::kLong);
  MicroBatch mb;
  mb.id = 0;
  mb.tensors["labels"] = tokens.slice(1, 1).contiguous();
  torch::Tensor hidden;
  {
    torch::NoGradGuard no_grad;
    hidden = RunLayers(head, {tokens.slice(1, 0, config.context_length).contiguous()}, mb)[0];
  }
  std::vector<torch::Tensor> params = sequential->parameters();
  auto forward = [&](torch::Tensor& input) {
    input = hidden.clone().requires_grad_(true);
    Activations out = runner ? runner(stage, {input}, mb) : RunLayers(stage, {input}, mb);
    return GptLoss(out, mb);
  };

  Samples full, input_half, weight_half, split;
  const int64_t steps = absl::GetFlag(FLAGS_steps), warmup = absl::GetFlag(FLAGS_warmup);
  for (int64_t s = 0; s < warmup + steps; ++s) {
    const bool measure = s >= warmup;
    {
      torch::Tensor input;
      torch::Tensor loss = forward(input);
      const auto t0 = BenchClock::now();
      const double c0 = CpuMs();
      loss.backward();
      if (measure) full.Add(WallMs(t0), CpuMs() - c0);
    }
    {
      torch::Tensor input;
      torch::Tensor loss = forward(input);
      const auto t0 = BenchClock::now();
      const double c0 = CpuMs();
      BackwardInputResult r = BackwardInput({loss}, {torch::Tensor()}, {input});
      loss = torch::Tensor();
      const double i_wall = WallMs(t0), i_cpu = CpuMs() - c0;
      const auto t1 = BenchClock::now();
      const double c1 = CpuMs();
      r.weight.Run();
      const double w_wall = WallMs(t1), w_cpu = CpuMs() - c1;
      if (measure) {
        input_half.Add(i_wall, i_cpu);
        weight_half.Add(w_wall, w_cpu);
        split.Add(i_wall + w_wall, i_cpu + w_cpu);
      }
    }
    for (torch::Tensor& p : params) p.mutable_grad().reset();
  }
  const double ratio_wall = Median(split.wall) / Median(full.wall);
  const double ratio_cpu = Min(split.cpu) / Min(full.cpu);
  std::printf(
      "split backward, GPT last stage of pp=2 (blocks %zu-%lld + norm + tied head + loss), "
      "width %lld, context %lld, batch %lld, checkpoint %s, %d threads, %lld reps\n",
      first - 1, static_cast<long long>(config.num_layers - 1),
      static_cast<long long>(config.width), static_cast<long long>(config.context_length),
      static_cast<long long>(batch), absl::GetFlag(FLAGS_checkpoint) ? "every layer" : "off",
      threads, static_cast<long long>(steps));
  std::printf("%-8s %-14s %-14s\n", "", "wall median ms", "cpu min ms");
  std::printf("%-8s %-14.2f %-14.2f\n", "B", Median(full.wall), Min(full.cpu));
  std::printf("%-8s %-14.2f %-14.2f\n", "I", Median(input_half.wall), Min(input_half.cpu));
  std::printf("%-8s %-14.2f %-14.2f\n", "W", Median(weight_half.wall), Min(weight_half.cpu));
  std::printf("%-8s %-14.2f %-14.2f\n", "I+W", Median(split.wall), Min(split.cpu));
  std::printf("(I+W)/B  %-14.3f %-14.3f  (target <= 1.15)\n", ratio_wall, ratio_cpu);
  nlohmann::json json;
  json["bench"] = "split_backward";
  json["checkpoint"] = absl::GetFlag(FLAGS_checkpoint);
  json["threads"] = threads;
  json["b_ms"] = Median(full.wall);
  json["i_ms"] = Median(input_half.wall);
  json["w_ms"] = Median(weight_half.wall);
  json["iw_over_b_wall"] = ratio_wall;
  json["iw_over_b_cpu_min"] = ratio_cpu;
  std::printf("%s\n", json.dump().c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pp::ExitCode("bench_split_backward", pp::Run());
}
