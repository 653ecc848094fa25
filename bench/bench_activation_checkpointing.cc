// Benchmark: what activation checkpointing buys and costs.
//
//   bazel run //bench:bench_activation_checkpointing -- --layers=16
//   bazel run //bench:bench_activation_checkpointing -- --model=gpt
//       --model_config='num_layers: 8 width: 256' --model_batch=16  (one line)
//
// --model=mlp is the bench's own stack of residual MLP blocks; any other name
// is a registered model (models/registry.h), built sequentially from its
// config message (defaults, then --model_config in text format) with a
// micro-batch of its own data (--data_source, --data_path) and its loss.
//
// For each checkpoint interval (0 = off) it trains the same model for a few
// forward+backward steps and reports (1) activation memory: bytes allocated
// by the forward and still alive when backward starts (what the autograd graph
// saves, plus the output), (2) the step's peak above the bytes alive before it
// (adds backward's transients and the recompute), and (3) step time: the
// median wall time and the minimum process CPU time over the steps. On a
// shared machine neighbours add wall time, and through caches and frequency
// some CPU time, but never take any away: the minimum CPU time is the
// steadiest estimate of a step's own cost (medians are in the JSON line).
// The forward's share of the uncheckpointed step bounds what recomputing every
// layer once must cost: "bound" = 1 + forward / step of interval 0.
// Memory is counted by a CPU allocator that wraps LibTorch's and tracks live
// and peak bytes (installed with c10::SetCPUAllocator before any tensor
// exists), so parameters and gradients, allocated before the step, drop out of
// the measured deltas. Configurations are measured round-robin so that a noisy
// neighbour slows all of them alike. Prints a table and one JSON line.
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_common.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"
#include "google/protobuf/text_format.h"
#include "models/model_config.pb.h"
#include "models/registry.h"
#include "nlohmann/json.hpp"
#include "pipeline/autograd/activation_checkpointing.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/testing/mlp_block.h"

ABSL_FLAG(std::string, model, "mlp",
          "mlp (a deep stack of residual MLP blocks) or a registered model's name, built "
          "sequentially (--model_config, --model_batch, --data_source, --data_path)");
ABSL_FLAG(int64_t, layers, 16, "number of MLP blocks");
ABSL_FLAG(int64_t, width, 512, "MLP block width");
ABSL_FLAG(int64_t, hidden, 2048, "MLP block hidden width");
ABSL_FLAG(int64_t, batch, 128, "rows per step");
ABSL_FLAG(double, dropout, 0.0, "dropout inside each MLP block (training mode)");
ABSL_FLAG(std::string, model_config, "",
          "a registered model: its config message's fields in text format, over its defaults "
          "(e.g. 'num_layers: 8 width: 256', as inside [pp.gpt] { ... } of a run's config)");
ABSL_FLAG(int64_t, model_batch, 16, "a registered model: samples per step (one micro-batch)");
ABSL_FLAG(std::string, data_source, "synthetic",
          "a registered model: its data source (one of the model's data_sources)");
ABSL_FLAG(std::string, data_path, "", "a registered model: its data file or folder, if any");
ABSL_FLAG(std::string, intervals, "0,1,2", "checkpoint intervals to compare; 0 = off");
ABSL_FLAG(int64_t, steps, 15, "measured steps per configuration");
ABSL_FLAG(int64_t, warmup, 2, "unmeasured steps per configuration");
ABSL_FLAG(bool, keep_freed_memory, true,
          "tell glibc malloc to keep freed memory instead of unmapping it, like a caching "
          "allocator: step times then measure compute, not page faults of re-mapped buffers");

namespace pp {
namespace {

// Counts live and peak bytes of every CPU tensor allocation. Sizes come from
// malloc_usable_size at allocation and free alike, so the bookkeeping is exact
// (it includes the allocator's small rounding slack).
class TrackingCpuAllocator final : public torch_compat::AllocatorBase {
 public:
  c10::DataPtr Allocate(size_t nbytes) const override {
    void* data = c10::alloc_cpu(nbytes);
    if (data != nullptr) Add(static_cast<int64_t>(malloc_usable_size(data)));
    return {data, data, &Free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Free; }

  static int64_t live() { return live_.load(); }
  static int64_t peak() { return peak_.load(); }
  static void ResetPeak() { peak_.store(live_.load()); }

 private:
  static void Add(int64_t n) {
    const int64_t now = live_.fetch_add(n) + n;
    int64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
  }
  static void Free(void* data) {
    if (data == nullptr) return;
    live_.fetch_sub(static_cast<int64_t>(malloc_usable_size(data)));
    c10::free_cpu(data);
  }
  static inline std::atomic<int64_t> live_{0};
  static inline std::atomic<int64_t> peak_{0};
};

TrackingCpuAllocator g_tracking_allocator;

// One model to benchmark: layers, an input and a scalar loss of the output.
struct BenchModel {
  std::string description;
  std::shared_ptr<torch::nn::Module> owner;  // Owns shared (tied) modules, if any.
  std::vector<Layer> layers;
  Activations inputs;
  MicroBatch batch;
  std::function<torch::Tensor(const Activations&, const MicroBatch&)> loss;
};

BenchModel MakeMlpModel() {
  const int64_t layers = absl::GetFlag(FLAGS_layers), width = absl::GetFlag(FLAGS_width),
                hidden = absl::GetFlag(FLAGS_hidden), batch = absl::GetFlag(FLAGS_batch);
  const double dropout = absl::GetFlag(FLAGS_dropout);
  torch::manual_seed(0);
  BenchModel model;
  model.description = absl::StrCat("mlp layers=", layers, " width=", width, " hidden=", hidden,
                                   " batch=", batch, " dropout=", dropout);
  model.layers = MakeMlpStack(layers, width, hidden, dropout);
  model.inputs = {torch::randn({batch, width})};
  model.loss = [](const Activations& out, const MicroBatch&) { return out[0].pow(2).mean(); };
  return model;
}

// A registered model built sequentially: its layers in order (a tied
// embedding at both ends), micro-batch 0 of step 0 of its own data, its loss.
// The StageModule is kept alive with the layers, since a tied layer only
// refers to the shared module that the StageModule owns.
absl::StatusOr<BenchModel> MakeRegisteredModel(const ModelInfo& info) {
  ModelConfig model_config;
  const google::protobuf::FieldDescriptor* extension = ModelExtension(info);
  google::protobuf::Message* config =
      model_config.GetReflection()->MutableMessage(&model_config, extension);
  const std::string text = absl::GetFlag(FLAGS_model_config);
  if (!google::protobuf::TextFormat::MergeFromString(text, config)) {
    return absl::InvalidArgumentError(absl::StrCat("--model_config='", text, "' is not a ",
                                                   config->GetTypeName(), " in text format"));
  }
  ModelRun run;
  run.micro_batch_size = absl::GetFlag(FLAGS_model_batch);
  run.data_source = absl::GetFlag(FLAGS_data_source);
  run.data_path = absl::GetFlag(FLAGS_data_path);
  if (info.validate) PP_RETURN_IF_ERROR(info.validate(*config, run));
  if (!info.data) {
    return absl::InvalidArgumentError(absl::StrCat("--model=", info.name, " has no data"));
  }
  PP_ASSIGN_OR_RETURN(ModelData data, info.data(*config, run));
  PP_ASSIGN_OR_RETURN(MicroBatchData micro_batch, data.train->Get(/*step=*/0, /*index=*/0));
  PP_ASSIGN_OR_RETURN(std::vector<LayerSpec> specs, info.specs(*config));
  PP_ASSIGN_OR_RETURN(StageModule sequential, BuildSequential(specs, /*base_seed=*/0));
  BenchModel model;
  model.description = absl::StrCat(info.name, " ", config->ShortDebugString(),
                                   " batch=", run.micro_batch_size, " (", data.description, ")");
  model.owner = sequential.ptr();
  model.layers = sequential->layers();
  model.inputs = std::move(micro_batch.inputs);
  model.batch = std::move(micro_batch.batch);
  model.loss = info.loss;
  return model;
}

absl::StatusOr<BenchModel> MakeModel(const std::string& name) {
  if (name == "mlp") return MakeMlpModel();
  if (const ModelInfo* info = FindModel(name); info != nullptr) return MakeRegisteredModel(*info);
  return absl::InvalidArgumentError(absl::StrCat("--model=", name, " is unknown; valid: mlp, ",
                                                 absl::StrJoin(RegisteredModelNames(), ", ")));
}

struct Config {
  int64_t interval = 0;
  LayerRunner runner;
  int64_t checkpointed_runs = 0;
  std::vector<double> step_ms;
  std::vector<double> step_cpu_ms;
  std::vector<double> forward_cpu_ms;
  int64_t held_bytes = 0;  // Max over steps (they are all equal in practice).
  int64_t peak_bytes = 0;
};

double ProcessCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

void RunStep(const BenchModel& model, Config& config, bool measure) {
  for (const Layer& layer : model.layers) layer->zero_grad(/*set_to_none=*/false);
  if (model.owner) model.owner->zero_grad(/*set_to_none=*/false);
  const int64_t before = TrackingCpuAllocator::live();
  TrackingCpuAllocator::ResetPeak();
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = ProcessCpuMs();
  torch::Tensor loss;
  {
    Activations out = config.runner(model.layers, model.inputs, model.batch);
    loss = model.loss(out, model.batch);
  }
  const int64_t held = TrackingCpuAllocator::live() - before;
  const double forward_cpu_ms = ProcessCpuMs() - cpu_start;
  loss.backward();
  loss = torch::Tensor();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const double cpu_ms = ProcessCpuMs() - cpu_start;
  if (!measure) return;
  config.step_ms.push_back(ms);
  config.step_cpu_ms.push_back(cpu_ms);
  config.forward_cpu_ms.push_back(forward_cpu_ms);
  config.held_bytes = std::max(config.held_bytes, held);
  config.peak_bytes = std::max(config.peak_bytes, TrackingCpuAllocator::peak() - before);
}

// The table (one row per interval, ratios to interval 0) and the JSON line.
void Report(const BenchModel& model, const std::vector<Config>& configs, int64_t steps) {
  const Config* off = nullptr;
  for (const Config& config : configs) {
    if (config.interval == 0) off = &config;
  }
  constexpr double kMiB = 1024.0 * 1024.0;
  std::printf("activation checkpointing, %s, %d threads, %lld steps each\n",
              model.description.c_str(), at::get_num_threads(), static_cast<long long>(steps));
  std::printf("%-9s %-8s %-11s %-7s %-14s %-7s %-8s %-7s %-8s %-7s %-8s\n", "interval", "ckpt",
              "activ. MiB", "vs off", "step peak MiB", "vs off", "wall ms", "vs off", "cpu min",
              "vs off", "fwd min");
  nlohmann::json json;
  json["bench"] = "activation_checkpointing";
  json["model"] = model.description;
  json["threads"] = at::get_num_threads();
  for (const Config& config : configs) {
    const double ms = Median(config.step_ms);
    auto ratio = [&](double value, double base) { return off ? value / base : 0.0; };
    const double held_ratio = off ? ratio(config.held_bytes, off->held_bytes) : 0.0;
    const double peak_ratio = off ? ratio(config.peak_bytes, off->peak_bytes) : 0.0;
    const double time_ratio = off ? ratio(ms, Median(off->step_ms)) : 0.0;
    const double cpu_ms = Min(config.step_cpu_ms);
    const double cpu_ratio = off ? ratio(cpu_ms, Min(off->step_cpu_ms)) : 0.0;
    const double cpu_median = Median(config.step_cpu_ms);
    const double forward_ms = Min(config.forward_cpu_ms);
    std::printf("%-9lld %-8s %-11.1f %-7.2f %-14.1f %-7.2f %-8.1f %-7.2f %-8.1f %-7.2f %-8.1f\n",
                static_cast<long long>(config.interval),
                absl::StrCat(config.checkpointed_runs, " runs").c_str(), config.held_bytes / kMiB,
                held_ratio, config.peak_bytes / kMiB, peak_ratio, ms, time_ratio, cpu_ms, cpu_ratio,
                forward_ms);
    json["configs"].push_back({{"interval", config.interval},
                               {"checkpointed_runs", config.checkpointed_runs},
                               {"activation_bytes", config.held_bytes},
                               {"step_peak_bytes", config.peak_bytes},
                               {"step_ms_median", ms},
                               {"activation_ratio_vs_off", held_ratio},
                               {"step_peak_ratio_vs_off", peak_ratio},
                               {"step_time_ratio_vs_off", time_ratio},
                               {"step_cpu_ms_min", cpu_ms},
                               {"step_cpu_ms_median", cpu_median},
                               {"step_cpu_ratio_vs_off", cpu_ratio},
                               {"forward_cpu_ms_min", forward_ms}});
  }
  if (off != nullptr) {
    const double bound = 1.0 + Min(off->forward_cpu_ms) / Min(off->step_cpu_ms);
    std::printf(
        "recomputing every layer once costs at least %.2fx (1 + forward/step at interval 0)\n",
        bound);
    json["recompute_bound_ratio"] = bound;
  }
  std::printf("%s\n", json.dump().c_str());
}

int Main() {
  SetBenchThreads(0);
  if (absl::GetFlag(FLAGS_keep_freed_memory)) {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  absl::StatusOr<BenchModel> model = MakeModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 2;
  }
  for (const Layer& layer : model->layers) layer->train();

  std::vector<Config> configs;
  for (absl::string_view token : absl::StrSplit(absl::GetFlag(FLAGS_intervals), ',')) {
    Config config;
    if (!absl::SimpleAtoi(token, &config.interval)) {
      std::cerr << "--intervals: '" << token << "' is not an integer (want e.g. 0,1,2)\n";
      return 2;
    }
    ActivationCheckpointPolicy policy;
    policy.interval = config.interval;
    absl::StatusOr<LayerRunner> runner = MakeCheckpointingRunner(policy);
    absl::StatusOr<std::vector<LayerRun>> runs = PlanLayerRuns(policy, [&] {
      std::vector<LayerTraits> traits;
      for (const Layer& layer : model->layers) traits.push_back(TraitsOf(*layer));
      return traits;
    }());
    if (!runner.ok() || !runs.ok()) {
      std::cerr << "--intervals: " << (runner.ok() ? runs.status() : runner.status()) << "\n";
      return 2;
    }
    config.runner = *runner;
    for (const LayerRun& run : *runs) config.checkpointed_runs += run.checkpointed;
    configs.push_back(std::move(config));
  }

  const int64_t steps = absl::GetFlag(FLAGS_steps), warmup = absl::GetFlag(FLAGS_warmup);
  for (int64_t s = 0; s < warmup + steps; ++s) {
    for (Config& config : configs) RunStep(*model, config, /*measure=*/s >= warmup);
  }

  Report(*model, configs, steps);
  return 0;
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  // Before any tensor exists, so every tensor's bytes are counted.
  c10::SetCPUAllocator(&pp::g_tracking_allocator, /*priority=*/1);
  absl::ParseCommandLine(argc, argv);
  return pp::Main();
}
