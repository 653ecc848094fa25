// pipe's engine at pp = 1 on one device (cpu or cuda), timed per step: the
// pipe side of the GPU kit's throughput tables (issues #31, #43). Its peers are
// bench/torch_gpt_reference.py and bench/torch_llama_reference.py, the same
// models in PyTorch on the same device; tools/gpu/run_on_device.sh runs both
// in one call and compares tokens/s (and, for LLaMA, model FLOPs utilisation).
//
// --model=gpt (default): bench_gpt_pp1's peer GPT (byte vocabulary 256,
// pre-LayerNorm blocks, tied LM head). --model=llama: models/llama of the
// size flags below and --vocab, --kv_heads, --intermediate (untied head, no
// dropout). Synthetic arithmetic-progression rows, AdamW, m micro-batches per
// step, --precision fp32 or bf16 (Megatron's recipe: bf16 weights and
// activations, fp32 masters and gradients). Tracing is off, so the engine
// queues a step's kernels without waiting for the device; each timed step
// ends with one wait for the device (WaitForDevice), the same as the
// references' torch.cuda.synchronize(). LibTorch's default keeps TF32 off.
//
//   bench/gpu_pp1 --device=cuda --steps=20     (bundle: bin/gpu_pp1)
//   ./bazelw run --config=cuda //bench:gpu_pp1 -- --device=cpu --steps=2
//   ./bazelw run --config=cuda //bench:gpu_pp1 -- --model=llama --precision=bf16 --steps=2
//
// Prints a table and one JSON line last.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_common.h"
#include "bench/peer_gpt.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"
#include "models/data/synthetic_lm_data.h"
#include "models/gpt/gpt.h"
#include "models/llama/llama.h"
#include "nlohmann/json.hpp"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/mixed_precision.h"
#include "pipeline/runtime/optimizer.h"
#include "pipeline/runtime/trainer.h"
#include "topology/device.h"
#include "topology/device_transfer.h"
#include "topology/parallel_grid.h"
#include "topology/process_topology.h"
#include "topology/rendezvous.h"

ABSL_FLAG(std::string, device, "cpu", "cpu or cuda (cuda:0).");
ABSL_FLAG(int, microbatches, 8, "Micro-batches per step.");
ABSL_FLAG(int, steps, 20, "Timed steps (after --warmup untimed ones).");
ABSL_FLAG(int, warmup, 3, "Untimed steps first (allocator, cuBLAS handles).");
ABSL_FLAG(std::string, model, "gpt", "gpt (the peer GPT) or llama.");
ABSL_FLAG(std::string, precision, "fp32", "fp32 or bf16.");
ABSL_FLAG(int, vocab, 32000, "--model=llama: vocabulary size (GPT's is 256, bytes).");
ABSL_FLAG(int, kv_heads, 4, "--model=llama: key/value heads (divide --heads).");
ABSL_FLAG(int, intermediate, 5632, "--model=llama: SwiGLU hidden size.");

namespace pp {
namespace {

// --model=llama: the LLaMA of the size flags, untied head, no dropout.
LlamaModelConfig BenchLlamaConfig() {
  LlamaModelConfig c;
  c.set_vocab_size(absl::GetFlag(FLAGS_vocab));
  c.set_width(absl::GetFlag(FLAGS_width));
  c.set_num_layers(absl::GetFlag(FLAGS_layers));
  c.set_num_heads(absl::GetFlag(FLAGS_heads));
  c.set_num_kv_heads(absl::GetFlag(FLAGS_kv_heads));
  c.set_intermediate_size(absl::GetFlag(FLAGS_intermediate));
  c.set_context_length(absl::GetFlag(FLAGS_context));
  c.set_tie_embeddings(false);
  c.set_dropout(0);
  return c;
}

// The table line and the JSON line of the timed steps.
void Report(const torch::Device& device, const SyntheticLmOptions& data, int64_t parameters, int m,
            int steps, int intra, const std::vector<double>& seconds,
            const std::vector<double>& losses) {
  const std::string model = absl::GetFlag(FLAGS_model);
  const double tokens = static_cast<double>(m) * data.lm.micro_batch_size * data.lm.seq_len;
  const double median = Median(seconds);
  std::printf(
      "pipe engine pp=1 on %s: %s %s width %d, %d blocks, m=%d x %lld x %lld tokens, %d steps\n",
      device.str().c_str(), model.c_str(), absl::GetFlag(FLAGS_precision).c_str(),
      absl::GetFlag(FLAGS_width), absl::GetFlag(FLAGS_layers), m,
      static_cast<long long>(data.lm.micro_batch_size), static_cast<long long>(data.lm.seq_len),
      steps);
  std::printf("  median step %.4f s (min %.4f)  %.1f tokens/s  loss %.4f -> %.4f\n", median,
              Min(seconds), tokens / median, losses.front(), losses.back());
  nlohmann::json j = {{"bench", "gpu_pp1"},
                      {"system", "pipe"},
                      {"device", device.str()},
                      {"torch", torch_compat::LibTorchVersion()},
                      {"model", model},
                      {"precision", absl::GetFlag(FLAGS_precision)},
                      {"parameters", parameters},
                      {"vocab", data.vocab},
                      {"width", absl::GetFlag(FLAGS_width)},
                      {"layers", absl::GetFlag(FLAGS_layers)},
                      {"heads", absl::GetFlag(FLAGS_heads)},
                      {"context", absl::GetFlag(FLAGS_context)},
                      {"micro_batch_size", absl::GetFlag(FLAGS_micro_batch_size)},
                      {"microbatches", m},
                      {"tokens_per_step", tokens},
                      {"step_s", seconds},
                      {"median_step_s", median},
                      {"tokens_per_s", tokens / median},
                      {"loss_first", losses.front()},
                      {"loss_last", losses.back()},
                      {"intra_op_threads", intra}};
  if (model == "llama") {
    j["kv_heads"] = absl::GetFlag(FLAGS_kv_heads);
    j["intermediate"] = absl::GetFlag(FLAGS_intermediate);
  }
  std::printf("%s\n", j.dump().c_str());
}

absl::Status Run() {
  const int intra = SetBenchThreads(0);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  if (steps < 1 || warmup < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps (", steps, ") must be >= 1 and --warmup (", warmup, ") >= 0"));
  }
  PP_ASSIGN_OR_RETURN(DeviceKind kind, ParseDeviceKind(absl::GetFlag(FLAGS_device)));
  // Refuses a missing device before any model is built.
  PP_RETURN_IF_ERROR(DeviceForLocalRank(kind, 0).status());

  PP_ASSIGN_OR_RETURN(Precision precision, ParsePrecision(absl::GetFlag(FLAGS_precision)));
  const std::string model_name = absl::GetFlag(FLAGS_model);
  if (model_name != "gpt" && model_name != "llama") {
    return absl::InvalidArgumentError(
        absl::StrCat("--model=", model_name, " is not known; valid: gpt, llama"));
  }
  const int m = absl::GetFlag(FLAGS_microbatches);
  SyntheticLmOptions data = PeerGptData(m);
  std::vector<LayerSpec> specs;
  LossFn loss = GptLoss;
  if (model_name == "gpt") {
    PP_ASSIGN_OR_RETURN(specs, MakeGptSpecs(PeerGptModelConfig()));
  } else {
    PP_ASSIGN_OR_RETURN(specs, MakeLlamaSpecs(BenchLlamaConfig()));
    data.vocab = absl::GetFlag(FLAGS_vocab);
    loss = LlamaLoss;
  }
  PP_ASSIGN_OR_RETURN(SyntheticLmBatchSource source, SyntheticLmBatchSource::Create(data));

  const std::string store = absl::StrCat("/tmp/gpu_pp1_", getpid(), "_store");
  PP_ASSIGN_OR_RETURN(PeerGptEngine engine, MakePeerGptEngine(specs, store, kind));
  const World& world = engine.world;
  std::unique_ptr<PipelineModel>& model = engine.model;
  model->to(world.device);
  int64_t parameters = 0;
  for (const torch::Tensor& p : model->parameters()) parameters += p.numel();
  TrainerOptions to;
  to.precision = precision;
  to.schedule = "1f1b";
  to.num_microbatches = m;
  to.optimizer.name = "adamw";
  to.optimizer.lr = 1e-3;
  to.report_grad_norm = false;  // the reference computes none either
  to.executor.p2p.device = world.device;
  PP_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                      Trainer::Create(&engine.grid, model.get(), loss, &source, to));

  std::vector<double> seconds;
  std::vector<double> losses;
  for (int s = 0; s < warmup + steps; ++s) {
    PP_RETURN_IF_ERROR(WaitForDevice(world.device, std::chrono::minutes(2), "before a step"));
    const auto t0 = BenchClock::now();
    // No observation: untraced, so no per-action device waits.
    PP_ASSIGN_OR_RETURN(StepResult r, trainer->Step());
    PP_RETURN_IF_ERROR(WaitForDevice(world.device, std::chrono::minutes(2), "a step's kernels"));
    const double wall = Seconds(t0, BenchClock::now());
    losses.push_back(r.loss);
    if (s >= warmup) seconds.push_back(wall);
  }
  Report(world.device, data, parameters, m, steps, intra, seconds, losses);
  ::unlink(store.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pp::ExitCode("gpu_pp1", pp::Run());
}
