// pipe's engine at pp = 1 against a hand-written LibTorch training loop on
// the peer GPT (issue #16: pp = 1 >= 0.98x the hand-written loop with the
// same threads). Both train the same model (same specs, seed and synthetic
// batches) with AdamW, m micro-batches per step, loss / m, no gradient norm;
// their steps alternate, so machine load hits both. Each step is timed by the
// wall clock and by this thread's CPU time: with one intra-op and one BLAS
// thread (the defaults here) every kernel runs on the calling thread, so CPU
// time compares the two even on a loaded machine. The loop's optimizer step is
// also timed on its own: its share of the loop's step, with pipe's
// MultiTensorAdamW (what MakeOptimizer gives, the default) or LibTorch's
// per-parameter torch::optim::AdamW (--adamw=per_parameter; issue #43). Prints
// a table and one JSON line.
//
//   ./bazelw run -c opt //bench:bench_gpt_pp1 -- --steps=8
//   ./bazelw run -c opt //bench:bench_gpt_pp1 -- --steps=8 --adamw=per_parameter
#include <unistd.h>

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
#include "models/data/synthetic_lm_data.h"
#include "models/gpt/gpt.h"
#include "nlohmann/json.hpp"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/multi_tensor_adamw.h"
#include "pipeline/runtime/optimizer.h"
#include "pipeline/runtime/trainer.h"
#include "topology/launcher.h"
#include "topology/parallel_grid.h"
#include "topology/process_topology.h"
#include "topology/rendezvous.h"

ABSL_FLAG(int, microbatches, 8, "Micro-batches per step.");
ABSL_FLAG(int, steps, 8, "Timed steps of each (after one warm-up step each).");
ABSL_FLAG(int, blas, 1, "OpenBLAS threads (intra-op threads: --threads, default 1).");
ABSL_FLAG(std::string, adamw, "multi_tensor",
          "The hand-written loop's AdamW: multi_tensor (pipe's MultiTensorAdamW, as the engine's) "
          "or per_parameter (LibTorch's torch::optim::AdamW, the same arithmetic).");

namespace pp {
namespace {

OptimizerConfig AdamW() {
  OptimizerConfig c;
  c.name = "adamw";
  c.lr = 1e-3;
  return c;
}

struct Timing {
  std::vector<double> wall, cpu;
};

// What the alternating steps measured.
struct Results {
  Timing loop, engine;
  std::vector<double> loop_optimizer_cpus;
  double engine_loss = 0;
  double max_param_diff = 0;
};

// The hand-written loop's AdamW: pipe's MultiTensorAdamW (what MakeOptimizer
// gives, as the engine's) or LibTorch's per-parameter torch::optim::AdamW.
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> LoopOptimizer(
    const std::string& adamw, const std::vector<torch::Tensor>& parameters) {
  if (adamw != "multi_tensor" && adamw != "per_parameter") {
    return absl::InvalidArgumentError(
        absl::StrCat("--adamw=", adamw, " is unknown; valid: multi_tensor, per_parameter"));
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer = MakeOptimizer(AdamW(), parameters);
  if (adamw == "per_parameter") {
    const OptimizerConfig c = AdamW();
    optimizer = std::make_unique<torch::optim::AdamW>(parameters,
                                                      torch::optim::AdamWOptions(c.lr)
                                                          .betas(std::make_tuple(c.beta1, c.beta2))
                                                          .eps(c.eps)
                                                          .weight_decay(c.weight_decay));
  } else if (dynamic_cast<MultiTensorAdamW*>(optimizer.get()) == nullptr) {
    return absl::InternalError("MakeOptimizer's adamw is not MultiTensorAdamW");
  }
  return optimizer;
}

// Same model, data and optimizer: both must end with the same parameters (up
// to summation order), or they did not do the same work.
absl::StatusOr<double> MaxParameterDiff(const std::vector<torch::Tensor>& a,
                                        const std::vector<torch::Tensor>& b) {
  torch::NoGradGuard no_grad;
  if (a.size() != b.size()) {
    return absl::InternalError(
        absl::StrCat("loop has ", a.size(), " parameters, engine ", b.size()));
  }
  double max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, (a[i] - b[i]).abs().max().item<double>());
  }
  return max_diff;
}

// The table and the JSON line.
void Report(const Results& r, const std::string& adamw, int m, int intra, int steps,
            double tokens) {
  const Timing& loop = r.loop;
  const Timing& engine = r.engine;
  std::printf("peer GPT training step, m=%d, %d intra-op + %d BLAS threads, %d alternating steps\n",
              m, intra, absl::GetFlag(FLAGS_blas), steps);
  std::printf("%-28s %12s %12s %12s\n", "run", "wall (s)", "cpu (s)", "tokens/s");
  std::printf("%-28s %12.4f %12.4f %12.1f\n", "hand-written LibTorch loop", Median(loop.wall),
              Median(loop.cpu), tokens / Median(loop.wall));
  std::printf("%-28s %12.4f %12.4f %12.1f\n", "pipe engine pp=1", Median(engine.wall),
              Median(engine.cpu), tokens / Median(engine.wall));
  const double ratio_wall = Median(loop.wall) / Median(engine.wall);
  const double ratio_cpu = Median(loop.cpu) / Median(engine.cpu);
  std::printf(
      "engine throughput / loop: %.3fx by wall, %.3fx by thread CPU (target >= 0.98); parameters "
      "differ by at most %.2e after %d steps\n",
      ratio_wall, ratio_cpu, r.max_param_diff, steps + 1);
  // The optimizer's share of the loop's step, by thread CPU.
  const double optimizer_share = Median(r.loop_optimizer_cpus) / Median(loop.cpu);
  std::printf("loop's AdamW (%s): %.2f ms of thread CPU per step, %.2f%% of the step\n",
              adamw.c_str(), 1e3 * Median(r.loop_optimizer_cpus), 100 * optimizer_share);
  nlohmann::json j = {{"bench", "gpt_pp1"},
                      {"adamw", adamw},
                      {"loop_optimizer_cpu_ms", 1e3 * Median(r.loop_optimizer_cpus)},
                      {"loop_optimizer_share_pct", 100 * optimizer_share},
                      {"loop_wall_s", Median(loop.wall)},
                      {"loop_cpu_s", Median(loop.cpu)},
                      {"engine_wall_s", Median(engine.wall)},
                      {"engine_cpu_s", Median(engine.cpu)},
                      {"ratio_wall", ratio_wall},
                      {"ratio_cpu", ratio_cpu},
                      {"engine_last_loss", r.engine_loss},
                      {"max_param_diff", r.max_param_diff},
                      {"intra_op_threads", intra},
                      {"blas_threads", absl::GetFlag(FLAGS_blas)},
                      {"steps", steps}};
  std::printf("%s\n", j.dump().c_str());
}

absl::Status Run() {
  const int intra = SetBenchThreads(1);
  SetBlasThreads(absl::GetFlag(FLAGS_blas));
  const int m = absl::GetFlag(FLAGS_microbatches);
  PP_ASSIGN_OR_RETURN(std::vector<LayerSpec> specs, MakeGptSpecs(PeerGptModelConfig()));
  const SyntheticLmOptions data = PeerGptData(m);
  PP_ASSIGN_OR_RETURN(SyntheticLmBatchSource loop_source, SyntheticLmBatchSource::Create(data));
  PP_ASSIGN_OR_RETURN(SyntheticLmBatchSource engine_source, SyntheticLmBatchSource::Create(data));

  // The hand-written loop: what a LibTorch user writes without pipe.
  PP_ASSIGN_OR_RETURN(StageModule loop_model, BuildSequential(specs, kPeerGptSeed));
  const std::string adamw = absl::GetFlag(FLAGS_adamw);
  PP_ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> loop_optimizer,
                      LoopOptimizer(adamw, loop_model->parameters()));
  double loop_optimizer_cpu = 0;  // of the last loop step
  auto loop_step = [&](int64_t step) -> absl::Status {
    loop_optimizer->zero_grad();
    for (int i = 0; i < m; ++i) {
      PP_ASSIGN_OR_RETURN(MicroBatchData d, loop_source.Get(step, i));
      torch::Tensor loss = GptLoss(loop_model->Forward(d.inputs, d.batch), d.batch);
      (loss / static_cast<double>(m)).backward();
    }
    const double c0 = ThreadCpuSeconds();
    loop_optimizer->step();
    loop_optimizer_cpu = ThreadCpuSeconds() - c0;
    return absl::OkStatus();
  };

  // pipe's engine, pp = 1 (one rank, 1F1B degenerates to F, B per micro-batch).
  const std::string store = absl::StrCat("/tmp/bench_gpt_pp1_", getpid(), "_store");
  PP_ASSIGN_OR_RETURN(PeerGptEngine engine, MakePeerGptEngine(specs, store, DeviceKind::kCpu));
  std::unique_ptr<PipelineModel>& model = engine.model;
  TrainerOptions to;
  to.schedule = "1f1b";
  to.num_microbatches = m;
  to.optimizer = AdamW();
  to.report_grad_norm = false;  // the loop computes none either
  PP_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                      Trainer::Create(&engine.grid, model.get(), GptLoss, &engine_source, to));

  Results results;
  const int steps = absl::GetFlag(FLAGS_steps);
  for (int s = 0; s <= steps; ++s) {
    double c0 = ThreadCpuSeconds();
    auto t0 = BenchClock::now();
    PP_RETURN_IF_ERROR(loop_step(s));
    const double loop_cpu = ThreadCpuSeconds() - c0;
    const double loop_wall = Seconds(t0, BenchClock::now());
    c0 = ThreadCpuSeconds();
    t0 = BenchClock::now();
    PP_ASSIGN_OR_RETURN(StepResult r, trainer->Step());
    const double engine_cpu = ThreadCpuSeconds() - c0;
    const double engine_wall = Seconds(t0, BenchClock::now());
    results.engine_loss = r.loss;
    if (s == 0) continue;  // warm-up
    results.loop.wall.push_back(loop_wall);
    results.loop.cpu.push_back(loop_cpu);
    results.loop_optimizer_cpus.push_back(loop_optimizer_cpu);
    results.engine.wall.push_back(engine_wall);
    results.engine.cpu.push_back(engine_cpu);
  }
  PP_ASSIGN_OR_RETURN(results.max_param_diff,
                      MaxParameterDiff(loop_model->parameters(), model->parameters()));
  Report(results, adamw, m, intra, steps,
         static_cast<double>(m) * data.lm.micro_batch_size * data.lm.seq_len);
  ::unlink(store.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pp::ExitCode("bench_gpt_pp1", pp::Run());
}
