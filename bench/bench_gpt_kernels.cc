// The peer GPT's compute in one process, without any engine: forward +
// backward of one micro-batch through the sequential model, timed both by the
// wall clock and by this thread's CPU time. With one intra-op and one BLAS
// thread every kernel runs on the calling thread, so its CPU time is the
// kernels' cost even on a loaded machine, where wall time is not: the figure
// to compare two versions of models/ kernels by (build each, run them
// alternately). Prints a table and one JSON line.
//
//   bazel-bin/bench/bench_gpt_kernels --reps=30
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "bench/bench_common.h"
#include "bench/peer_gpt.h"
#include "common/status_macros.h"
#include "models/data/synthetic_lm_data.h"
#include "models/gpt/gpt.h"
#include "nlohmann/json.hpp"
#include "observability/operator_profiler.h"
#include "pipeline/pipeline_model.h"
#include "topology/launcher.h"

ABSL_FLAG(int, reps, 30, "Timed micro-batches (after 3 warm-up ones).");
ABSL_FLAG(int, blas, 1, "OpenBLAS threads (intra-op threads: --threads, default 1).");
ABSL_FLAG(int, stages, 1,
          "> 1: cut the model into this many stages with --partition and time each stage's "
          "forward + backward separately (thread CPU time): how even a partition is.");
ABSL_FLAG(std::string, partition, "type:TransformerBlock", "Partition method for --stages > 1.");
ABSL_FLAG(int, profile_reps, 0,
          "> 0: after the timed micro-batches, profile this many more with the operator profiler "
          "(observability/operator_profiler.h, what train_gpt's --profile_steps uses) and print "
          "each operator's self time (its time less its children's), the table to compare with "
          "bench/peer_gpt_kernels.py --profile.");
ABSL_FLAG(bool, keep_freed_memory, true,
          "Keep freed blocks mapped (glibc mmap/trim thresholds 1 GiB), as the launcher sets for "
          "train_gpt's workers; false: glibc's defaults, under which activation-sized tensors are "
          "page-faulted in afresh every micro-batch (measured: +3 ms on the last of 4 stages of "
          "gpt_small).");

namespace pp {
namespace {

void ForwardBackward(StageModule& model, const MicroBatch& batch) {
  Activations out = model->Forward({}, batch);
  GptLoss(out, batch).backward();
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
}

// Self time per operator name (an event's duration less its direct
// children's on the same thread), like torch.autograd.profiler's "Self CPU".
absl::Status PrintOperatorTable(StageModule& model, SyntheticLmBatchSource& source, int reps) {
  OperatorProfilerOptions options;
  options.steps = {1, reps};
  PP_ASSIGN_OR_RETURN(std::unique_ptr<OperatorProfiler> profiler,
                      OperatorProfiler::Create(options));
  for (int i = 1; i <= reps; ++i) {
    PP_RETURN_IF_ERROR(profiler->BeginStep(i));
    ForwardBackward(model, source.Batch(1000 + i, 0));
    PP_RETURN_IF_ERROR(profiler->EndStep(i));
  }
  struct Row {
    int64_t self_us = 0;
    int64_t total_us = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Row> rows;
  const std::vector<OperatorEvent>& events = profiler->events();
  // Events come parents first; a stack of open events per thread finds each
  // event's parent.
  std::map<uint64_t, std::vector<size_t>> open;
  std::vector<int64_t> child_us(events.size(), 0);
  for (size_t i = 0; i < events.size(); ++i) {
    const OperatorEvent& e = events[i];
    std::vector<size_t>& stack = open[e.thread];
    while (!stack.empty() &&
           events[stack.back()].start_us + events[stack.back()].duration_us <= e.start_us) {
      stack.pop_back();
    }
    if (!stack.empty()) child_us[stack.back()] += e.duration_us;
    stack.push_back(i);
  }
  int64_t all_self = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    Row& row = rows[events[i].name];
    row.self_us += events[i].duration_us - child_us[i];
    row.total_us += events[i].duration_us;
    ++row.calls;
    all_self += events[i].duration_us - child_us[i];
  }
  std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.self_us > b.second.self_us; });
  std::printf(
      "operators over %d micro-batches (self time, profiled; all: %.1f ms per micro-batch)\n", reps,
      1e-3 * all_self / reps);
  std::printf("  %-56s %12s %12s %8s\n", "name", "self ms/mb", "total ms/mb", "calls/mb");
  for (size_t i = 0; i < sorted.size() && i < 45; ++i) {
    const Row& r = sorted[i].second;
    std::printf("  %-56s %12.3f %12.3f %8.1f\n", sorted[i].first.substr(0, 56).c_str(),
                1e-3 * r.self_us / reps, 1e-3 * r.total_us / reps,
                static_cast<double>(r.calls) / reps);
  }
  return absl::OkStatus();
}

// --stages > 1: every stage of the partition in this thread, in pipeline
// order (forward through all, backward back), each timed on its own.
absl::Status RunStages(const std::vector<LayerSpec>& specs, SyntheticLmBatchSource& source,
                       int reps) {
  const int p = absl::GetFlag(FLAGS_stages);
  std::vector<std::unique_ptr<PipelineModel>> stages;
  PipelineModelOptions mo;
  mo.num_stages = p;
  mo.partition_method = absl::GetFlag(FLAGS_partition);
  mo.base_seed = kPeerGptSeed;
  for (int s = 0; s < p; ++s) {
    PP_ASSIGN_OR_RETURN(std::unique_ptr<PipelineModel> m, PipelineModel::Create(specs, mo, s));
    stages.push_back(std::move(m));
  }
  std::vector<std::vector<double>> cpu(p), cpu_f(p);
  for (int i = 0; i < reps + 3; ++i) {
    const MicroBatch batch = source.Batch(i, 0);
    std::vector<Activations> inputs(p), outputs(p);
    std::vector<double> spent(p, 0), spent_f(p, 0);
    for (int s = 0; s < p; ++s) {
      if (s > 0) {
        for (const torch::Tensor& t : outputs[s - 1]) {
          inputs[s].push_back(t.is_floating_point() ? t.detach().requires_grad_(true) : t.detach());
        }
      }
      const double c0 = ThreadCpuSeconds();
      outputs[s] = stages[s]->chunk(0)->Forward(inputs[s], batch);
      if (s == p - 1) outputs[s] = {GptLoss(outputs[s], batch)};
      spent_f[s] += ThreadCpuSeconds() - c0;
      spent[s] += ThreadCpuSeconds() - c0;
    }
    for (int s = p - 1; s >= 0; --s) {
      const double c0 = ThreadCpuSeconds();
      if (s == p - 1) {
        outputs[s][0].backward();
      } else {
        std::vector<torch::Tensor> outs, grads;
        for (size_t k = 0; k < outputs[s].size(); ++k) {
          if (!inputs[s + 1][k].requires_grad() || !inputs[s + 1][k].grad().defined()) continue;
          outs.push_back(outputs[s][k]);
          grads.push_back(inputs[s + 1][k].grad());
        }
        torch::autograd::backward(outs, grads);
      }
      spent[s] += ThreadCpuSeconds() - c0;
    }
    for (auto& m : stages) {
      for (auto& param : m->parameters()) param.mutable_grad() = torch::Tensor();
    }
    if (i < 3) continue;
    for (int s = 0; s < p; ++s) {
      cpu[s].push_back(spent[s]);
      cpu_f[s].push_back(spent_f[s]);
    }
  }
  std::printf("peer GPT F+B per micro-batch per stage, --partition=%s, %d reps (thread CPU time)\n",
              mo.partition_method.c_str(), reps);
  nlohmann::json j = {{"bench", "gpt_kernels_stages"}, {"partition", mo.partition_method}};
  double total = 0;
  for (int s = 0; s < p; ++s) total += Median(cpu[s]);
  for (int s = 0; s < p; ++s) {
    std::printf(
        "  stage %d: layers [%lld, %lld)  cpu median %.2f ms  (%.1f%% of the sum; forward %.2f "
        "ms)\n",
        s, static_cast<long long>(stages[s]->chunk(0)->first_layer()),
        static_cast<long long>(stages[s]->chunk(0)->end_layer()), 1e3 * Median(cpu[s]),
        100 * Median(cpu[s]) / total, 1e3 * Median(cpu_f[s]));
    j["cpu_ms_median"].push_back(1e3 * Median(cpu[s]));
    j["forward_cpu_ms_median"].push_back(1e3 * Median(cpu_f[s]));
  }
  std::printf("%s\n", j.dump().c_str());
  return absl::OkStatus();
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_keep_freed_memory)) {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  const int intra = SetBenchThreads(1);
  SetBlasThreads(absl::GetFlag(FLAGS_blas));
  PP_ASSIGN_OR_RETURN(std::vector<LayerSpec> specs, MakeGptSpecs(PeerGptModelConfig()));
  PP_ASSIGN_OR_RETURN(StageModule model, BuildSequential(specs, kPeerGptSeed));
  const SyntheticLmOptions data = PeerGptData(1);
  PP_ASSIGN_OR_RETURN(SyntheticLmBatchSource source, SyntheticLmBatchSource::Create(data));
  const int reps = absl::GetFlag(FLAGS_reps);
  if (absl::GetFlag(FLAGS_stages) > 1) return RunStages(specs, source, reps);
  std::vector<double> wall, cpu;
  for (int i = 0; i < reps + 3; ++i) {
    const MicroBatch batch = source.Batch(i, 0);
    const double c0 = ThreadCpuSeconds();
    const auto t0 = BenchClock::now();
    Activations out = model->Forward({}, batch);
    GptLoss(out, batch).backward();
    const double c1 = ThreadCpuSeconds();
    const auto t1 = BenchClock::now();
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    if (i < 3) continue;
    wall.push_back(Seconds(t0, t1));
    cpu.push_back(c1 - c0);
  }
  if (absl::GetFlag(FLAGS_profile_reps) > 0) {
    PP_RETURN_IF_ERROR(PrintOperatorTable(model, source, absl::GetFlag(FLAGS_profile_reps)));
  }
  const double tokens = static_cast<double>(data.lm.micro_batch_size * data.lm.seq_len);
  std::printf("peer GPT F+B per micro-batch (%d intra-op + %d BLAS threads, %d reps)\n", intra,
              absl::GetFlag(FLAGS_blas), reps);
  std::printf("  wall  median %.2f ms  min %.2f ms\n", 1e3 * Median(wall), 1e3 * Min(wall));
  std::printf("  cpu   median %.2f ms  min %.2f ms  (%.0f tokens/s of this thread)\n",
              1e3 * Median(cpu), 1e3 * Min(cpu), tokens / Median(cpu));
  nlohmann::json j = {{"bench", "gpt_kernels"},
                      {"wall_ms_median", 1e3 * Median(wall)},
                      {"wall_ms_min", 1e3 * Min(wall)},
                      {"cpu_ms_median", 1e3 * Median(cpu)},
                      {"cpu_ms_min", 1e3 * Min(cpu)},
                      {"intra_op_threads", intra},
                      {"blas_threads", absl::GetFlag(FLAGS_blas)},
                      {"reps", reps}};
  std::printf("%s\n", j.dump().c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pp::ExitCode("bench_gpt_kernels", pp::Run());
}
