// Benchmark: what splitting a stage's backward into I and W costs.
//
//   ./bazelw run //bench:bench_split_backward -- --steps=30
//
// The stage is the last stage of the README's main command (train_gpt: a
// 4-block GPT, width 128, context 64, 8 sequences per micro-batch, pp = 2):
// blocks 2 and 3, the final norm, the tied LM head and the loss, fed hidden
// states that require grad (as a received activation does). Per repetition it
// runs forward, then either one full backward (B) or BackwardInput (I) and
// WeightGradTask::Run (W) (pipeline/autograd/split_backward.h), timing only the
// backward part. Variants alternate within each repetition (B, I+W, B, ...),
// so a noisy neighbour slows both alike; medians of wall time and medians and
// minima of thread CPU time are reported. The bar: time(I) + time(W) <=
// 1.15 x time(B). With --checkpoint every layer is a checkpointed range
// (interval 1; the forward recompute then sits in I). --stage=block times one
// transformer block instead (a middle virtual stage of ZB-V on that GPT).
// CPU is this thread's (CLOCK_THREAD_CPUTIME_ID). --op_table adds each
// operator's and autograd node's self CPU time, B vs I+W, and the time outside
// any operator (engine, graph walks). Prints tables and one JSON line.
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_common.h"
#include "common/status_macros.h"
#include "models/gpt/gpt.h"
#include "nlohmann/json.hpp"
#include "pipeline/autograd/activation_checkpointing.h"
#include "pipeline/autograd/split_backward.h"
#include "pipeline/layers/layer.h"
#include "pipeline/pipeline_model.h"

ABSL_FLAG(int64_t, gpt_layers, 4,
          "transformer blocks of the whole model (the stage: the last half)");
ABSL_FLAG(int64_t, gpt_width, 128, "width");
ABSL_FLAG(int64_t, gpt_heads, 4, "attention heads");
ABSL_FLAG(int64_t, gpt_context, 64, "sequence length");
ABSL_FLAG(int64_t, gpt_batch, 8, "sequences per micro-batch");
ABSL_FLAG(bool, checkpoint, false, "checkpoint every layer of the stage (interval 1)");
ABSL_FLAG(std::string, stage, "last",
          "which stage: \"last\" (the last half of the blocks + norm + tied head + loss, "
          "pp = 2's last stage) or \"block\" (one transformer block fed a random output "
          "gradient, a middle virtual stage of ZB-V on the 4-block GPT)");
ABSL_FLAG(bool, op_table, false,
          "also print, per operator / autograd node, this thread's CPU time outside nested "
          "operators (self time) summed over the measured repetitions, B vs I+W");
ABSL_FLAG(int64_t, steps, 30, "measured repetitions per variant");
ABSL_FLAG(int64_t, warmup, 3, "unmeasured repetitions per variant");

namespace pp {
namespace {

// This thread's CPU time: with one intra-op and one BLAS thread every kernel
// runs here.
double CpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// --op_table: self CPU time per RecordFunction name (operators and autograd
// nodes), charged to the table `current` points at (null: not measured).
struct OpCost {
  double self_ms = 0;
  int64_t calls = 0;
};
using OpTable = std::map<std::string, OpCost>;
struct OpFrame {
  std::string name;
  double start_ms = 0;
  double children_ms = 0;
};
thread_local OpTable* current_table = nullptr;
thread_local std::vector<OpFrame> op_stack;

struct OpContext : at::ObserverContext {};

std::unique_ptr<at::ObserverContext> OnOpStart(const at::RecordFunction& fn) {
  op_stack.push_back(OpFrame{fn.name(), CpuMs(), 0});
  return std::make_unique<OpContext>();
}

void OnOpEnd(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
  if (op_stack.empty()) return;
  OpFrame frame = std::move(op_stack.back());
  op_stack.pop_back();
  const double total = CpuMs() - frame.start_ms;
  if (!op_stack.empty()) op_stack.back().children_ms += total;
  if (current_table == nullptr) return;
  OpCost& cost = (*current_table)[frame.name];
  cost.self_ms += total - frame.children_ms;
  cost.calls += 1;
}

// Adds one repetition's CPU time; the part outside every operator is charged
// to "(outside operators)".
void ChargeOutside(OpTable& table, double total_ms) {
  double inside = 0;
  for (const auto& [name, cost] : table) {
    if (name != "(outside operators)" && name != "(total)") inside += cost.self_ms;
  }
  table["(total)"].self_ms += total_ms;
  table["(outside operators)"].self_ms = table["(total)"].self_ms - inside;
}

void PrintOpTable(const OpTable& b, const OpTable& iw, int64_t reps) {
  std::map<std::string, std::pair<OpCost, OpCost>> rows;
  for (const auto& [name, cost] : b) rows[name].first = cost;
  for (const auto& [name, cost] : iw) rows[name].second = cost;
  std::vector<std::pair<std::string, std::pair<OpCost, OpCost>>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) {
    return x.second.second.self_ms - x.second.first.self_ms >
           y.second.second.self_ms - y.second.first.self_ms;
  });
  std::printf("self cpu per repetition (ms) and calls per repetition, sorted by I+W - B\n");
  std::printf("%-44s %9s %7s %9s %7s %9s\n", "name", "B ms", "calls", "I+W ms", "calls", "diff");
  for (const auto& [name, costs] : sorted) {
    const double db = costs.first.self_ms / reps, diw = costs.second.self_ms / reps;
    if (std::max(std::abs(db), std::abs(diw)) < 0.01) continue;
    std::printf("%-44s %9.3f %7.1f %9.3f %7.1f %+9.3f\n", name.substr(0, 44).c_str(), db,
                static_cast<double>(costs.first.calls) / reps, diw,
                static_cast<double>(costs.second.calls) / reps, diw - db);
  }
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

// The stage's forward: sets its input (a leaf that requires grad) and returns
// the backward's root and its gradient (undefined: ones, for the loss).
using StageForward = std::function<std::pair<torch::Tensor, torch::Tensor>(torch::Tensor&)>;

// One forward, then the whole backward (B), timed; added to `full` (and the
// operator table) when `measure`.
void TimeFullBackward(const StageForward& forward, bool measure, bool op_table, Samples& full,
                      OpTable& full_ops) {
  torch::Tensor input;
  auto [root, root_grad] = forward(input);
  if (measure && op_table) current_table = &full_ops;
  const auto t0 = BenchClock::now();
  const double c0 = CpuMs();
  torch::autograd::backward({root}, {root_grad});
  const double b_wall = WallMs(t0), b_cpu = CpuMs() - c0;
  current_table = nullptr;
  if (measure) {
    full.Add(b_wall, b_cpu);
    if (op_table) ChargeOutside(full_ops, b_cpu);
  }
}

// One forward, then the backward split into its input (I) and weight (W)
// halves, each timed.
void TimeSplitBackward(const StageForward& forward, bool measure, bool op_table,
                       Samples& input_half, Samples& weight_half, Samples& split,
                       OpTable& split_ops) {
  torch::Tensor input;
  auto [root, root_grad] = forward(input);
  if (measure && op_table) current_table = &split_ops;
  const auto t0 = BenchClock::now();
  const double c0 = CpuMs();
  BackwardInputResult r = BackwardInput({root}, {root_grad}, {input});
  root = torch::Tensor();
  const double i_wall = WallMs(t0), i_cpu = CpuMs() - c0;
  const auto t1 = BenchClock::now();
  const double c1 = CpuMs();
  r.weight.Run();
  const double w_wall = WallMs(t1), w_cpu = CpuMs() - c1;
  current_table = nullptr;
  if (measure) {
    input_half.Add(i_wall, i_cpu);
    weight_half.Add(w_wall, w_cpu);
    split.Add(i_wall + w_wall, i_cpu + w_cpu);
    if (op_table) ChargeOutside(split_ops, i_cpu + w_cpu);
  }
}

// The table (B, I, W, I+W and their ratio), the operator table with
// --op_table, and the JSON line.
void Report(const GptModelConfig& config, int64_t batch, int threads, int64_t steps, bool last,
            const Samples& full, const Samples& input_half, const Samples& weight_half,
            const Samples& split, const OpTable& full_ops, const OpTable& split_ops) {
  const double ratio_wall = Median(split.wall) / Median(full.wall);
  const double ratio_cpu = Min(split.cpu) / Min(full.cpu);
  const double ratio_cpu_median = Median(split.cpu) / Median(full.cpu);
  std::printf(
      "split backward, GPT %s (%s), width %lld, context %lld, batch %lld, checkpoint %s, "
      "%d threads, %lld reps, thread cpu\n",
      last ? "last stage of pp=2" : "one block",
      last ? "last blocks + norm + tied head + loss" : "a middle virtual stage",
      static_cast<long long>(config.width()), static_cast<long long>(config.context_length()),
      static_cast<long long>(batch), absl::GetFlag(FLAGS_checkpoint) ? "every layer" : "off",
      threads, static_cast<long long>(steps));
  std::printf("%-8s %-14s %-14s %-14s\n", "", "wall median ms", "cpu median ms", "cpu min ms");
  auto row = [](const char* name, const Samples& x) {
    std::printf("%-8s %-14.2f %-14.3f %-14.3f\n", name, Median(x.wall), Median(x.cpu), Min(x.cpu));
  };
  row("B", full);
  row("I", input_half);
  row("W", weight_half);
  row("I+W", split);
  std::printf("(I+W)/B  %-14.3f %-14.3f %-14.3f (target <= 1.15)\n", ratio_wall, ratio_cpu_median,
              ratio_cpu);
  if (absl::GetFlag(FLAGS_op_table)) PrintOpTable(full_ops, split_ops, steps);
  nlohmann::json json;
  json["bench"] = "split_backward";
  json["checkpoint"] = absl::GetFlag(FLAGS_checkpoint);
  json["threads"] = threads;
  json["b_ms"] = Median(full.wall);
  json["i_ms"] = Median(input_half.wall);
  json["w_ms"] = Median(weight_half.wall);
  json["iw_over_b_wall"] = ratio_wall;
  json["stage"] = absl::GetFlag(FLAGS_stage);
  json["iw_over_b_cpu_median"] = ratio_cpu_median;
  json["iw_over_b_cpu_min"] = ratio_cpu;
  std::printf("%s\n", json.dump().c_str());
}

absl::Status Run() {
  const int threads = SetBenchThreads(1);
  // Keep freed memory mapped (like a caching allocator), so that both
  // variants time compute rather than page faults of re-mapped buffers.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  GptModelConfig config;
  config.set_num_layers(absl::GetFlag(FLAGS_gpt_layers));
  config.set_width(absl::GetFlag(FLAGS_gpt_width));
  config.set_num_heads(absl::GetFlag(FLAGS_gpt_heads));
  config.set_context_length(absl::GetFlag(FLAGS_gpt_context));
  config.set_dropout(0.0);
  const int64_t batch = absl::GetFlag(FLAGS_gpt_batch);
  PP_ASSIGN_OR_RETURN(std::vector<LayerSpec> specs, MakeGptSpecs(config));
  PP_ASSIGN_OR_RETURN(StageModule sequential, BuildSequential(specs, /*base_seed=*/0));
  std::vector<Layer> layers = sequential->layers();
  // Layer 0 is the embedding, then the blocks: the stage starts at the block
  // the pp = 2 split of the blocks gives stage 1.
  const std::string which = absl::GetFlag(FLAGS_stage);
  if (which != "last" && which != "block") {
    return absl::InvalidArgumentError(
        absl::StrCat("--stage=", which, ": valid are \"last\" and \"block\""));
  }
  const bool last = which == "last";
  const size_t first = 1 + static_cast<size_t>(config.num_layers() / 2);
  std::vector<Layer> head(layers.begin(), layers.begin() + first);
  std::vector<Layer> stage(layers.begin() + first,
                           last ? layers.end() : layers.begin() + first + 1);
  LayerRunner runner;
  if (absl::GetFlag(FLAGS_checkpoint)) {
    ActivationCheckpointPolicy policy;
    policy.interval = 1;
    PP_ASSIGN_OR_RETURN(runner, MakeCheckpointingRunner(policy));
  }
  torch::manual_seed(0);
  torch::Tensor tokens =
      torch::randint(config.vocab_size(), {batch, config.context_length() + 1}, torch::kLong);
  MicroBatch mb;
  mb.id = 0;
  mb.tensors["labels"] = tokens.slice(1, 1).contiguous();
  torch::Tensor hidden;
  {
    torch::NoGradGuard no_grad;
    hidden = RunLayers(head, {tokens.slice(1, 0, config.context_length()).contiguous()}, mb)[0];
  }
  const torch::Tensor output_grad = torch::randn_like(hidden) * 1e-3;
  std::vector<torch::Tensor> params = sequential->parameters();
  // The stage's forward: sets `input`, returns the backward's root and its
  // gradient (undefined: ones, for the loss).
  auto forward = [&](torch::Tensor& input) {
    input = hidden.clone().requires_grad_(true);
    Activations out = runner ? runner(stage, {input}, mb) : RunLayers(stage, {input}, mb);
    if (last) return std::make_pair(GptLoss(out, mb), torch::Tensor());
    return std::make_pair(out[0], output_grad);
  };

  const bool op_table = absl::GetFlag(FLAGS_op_table);
  at::CallbackHandle op_callback = 0;
  if (op_table) {
    op_callback = at::addThreadLocalCallback(at::RecordFunctionCallback(&OnOpStart, &OnOpEnd));
  }
  OpTable full_ops, split_ops;
  Samples full, input_half, weight_half, split;
  const int64_t steps = absl::GetFlag(FLAGS_steps), warmup = absl::GetFlag(FLAGS_warmup);
  for (int64_t s = 0; s < warmup + steps; ++s) {
    const bool measure = s >= warmup;
    TimeFullBackward(forward, measure, op_table, full, full_ops);
    // Both variants start from no .grad (AccumulateGrad then takes the
    // gradient instead of adding it).
    for (torch::Tensor& p : params) p.mutable_grad().reset();
    TimeSplitBackward(forward, measure, op_table, input_half, weight_half, split, split_ops);
    for (torch::Tensor& p : params) p.mutable_grad().reset();
  }
  if (op_table) at::removeCallback(op_callback);
  Report(config, batch, threads, steps, last, full, input_half, weight_half, split, full_ops,
         split_ops);
  return absl::OkStatus();
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pp::ExitCode("bench_split_backward", pp::Run());
}
