#include "experiments/train_lib.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <glog/logging.h>
#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/activation/activation_checkpointing.h"
#include "checkpoint/model/trainer_checkpoint.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "experiments/loss_curve.h"
#include "experiments/nonfinite_guard.h"
#include "experiments/preflight.h"
#include "experiments/run_observability.h"
#include "experiments/worker_status_observer.h"
#include "models/data/corpus.h"
#include "models/data/lm_data.h"
#include "models/data/mlm_data.h"
#include "models/data/synthetic_lm_data.h"
#include "models/data/tokenizer.h"
#include "models/gpt/pipeline_sampler.h"
#include "models/gpt/sample.h"
#include "nlohmann/json.hpp"
#include "observability/rank_log.h"
#include "pipeline/partition/partitioner.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/action_log.h"
#include "pipeline/runtime/action_observer.h"
#include "pipeline/runtime/trainer.h"
#include "pipeline/schedule/csv.h"
#include "pipeline/schedule/registry.h"
#include "topology/launcher.h"
#include "topology/launcher_status.h"
#include "topology/parallel_grid.h"
#include "topology/process_topology.h"
#include "topology/rendezvous.h"
#include "topology/wait_work.h"

ABSL_FLAG(std::string, config, "",
          "ExperimentConfig text proto; default experiments/configs/gpt_small_pp2.textproto "
          "(train_gpt) or "
          "bert_small_pp2.textproto (train_bert), relative to the workspace");
ABSL_FLAG(std::vector<std::string>, set, {},
          "field overrides, comma-separated: --set=optimizer.lr=1e-3,steps=50");
ABSL_FLAG(std::string, pp, "", "override parallelism.pp (pipeline stages)");
ABSL_FLAG(std::string, dp, "", "override parallelism.dp (data-parallel replicas)");
ABSL_FLAG(std::string, schedule, "", "override parallelism.schedule");
ABSL_FLAG(std::string, chunks, "", "override parallelism.chunks");
ABSL_FLAG(std::string, microbatches, "", "override parallelism.num_microbatches");
ABSL_FLAG(std::string, micro_batch_size, "", "override parallelism.micro_batch_size");
ABSL_FLAG(std::string, partition, "", "override parallelism.partition_method");
ABSL_FLAG(std::string, ckpt_interval, "", "override parallelism.activation_checkpointing.interval");
ABSL_FLAG(std::string, device, "", "override parallelism.device (cpu or cuda)");
ABSL_FLAG(std::string, p2p_static_shapes, "",
          "override parallelism.p2p_static_shapes (true: activation headers on each channel's "
          "first message only)");
ABSL_FLAG(std::string, p2p_post_receives_ahead, "",
          "override parallelism.p2p_post_receives_ahead (true: each p2p channel's next receive is "
          "posted as soon as the previous one is consumed, not at the moment of need)");
ABSL_FLAG(std::string, lr, "", "override optimizer.lr");
ABSL_FLAG(std::string, steps, "", "override steps");
ABSL_FLAG(std::string, eval_interval, "", "override eval_interval");
ABSL_FLAG(std::string, seed, "", "override seed");
ABSL_FLAG(std::string, data, "", "override data.path (a text file or folder)");
ABSL_FLAG(std::string, output_dir, "", "override output_dir");
ABSL_FLAG(std::string, name, "", "override name");
ABSL_FLAG(std::string, sample_tokens, "", "override sample_tokens");
ABSL_FLAG(std::string, save_interval, "", "override checkpoint.save_interval");
ABSL_FLAG(std::string, resume, "", "override checkpoint.resume");
ABSL_FLAG(std::string, keep_last, "", "override checkpoint.keep_last");

namespace pp {
namespace {

namespace fs = std::filesystem;

struct OverrideFlag {
  absl::Flag<std::string>* flag;
  const char* path;
};

const std::vector<OverrideFlag>& OverrideFlagTable() {
  static const auto* table = new std::vector<OverrideFlag>{
      {&FLAGS_pp, "parallelism.pp"},
      {&FLAGS_dp, "parallelism.dp"},
      {&FLAGS_schedule, "parallelism.schedule"},
      {&FLAGS_chunks, "parallelism.chunks"},
      {&FLAGS_microbatches, "parallelism.num_microbatches"},
      {&FLAGS_micro_batch_size, "parallelism.micro_batch_size"},
      {&FLAGS_partition, "parallelism.partition_method"},
      {&FLAGS_ckpt_interval, "parallelism.activation_checkpointing.interval"},
      {&FLAGS_device, "parallelism.device"},
      {&FLAGS_p2p_static_shapes, "parallelism.p2p_static_shapes"},
      {&FLAGS_p2p_post_receives_ahead, "parallelism.p2p_post_receives_ahead"},
      {&FLAGS_lr, "optimizer.lr"},
      {&FLAGS_steps, "steps"},
      {&FLAGS_eval_interval, "eval_interval"},
      {&FLAGS_seed, "seed"},
      {&FLAGS_data, "data.path"},
      {&FLAGS_output_dir, "output_dir"},
      {&FLAGS_name, "name"},
      {&FLAGS_sample_tokens, "sample_tokens"},
      {&FLAGS_save_interval, "checkpoint.save_interval"},
      {&FLAGS_resume, "checkpoint.resume"},
      {&FLAGS_keep_last, "checkpoint.keep_last"},
  };
  return *table;
}

// `bazel run` starts the binary in its runfiles tree; paths a person typed are
// relative to the workspace.
std::string FromWorkspace(const std::string& path) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return workspace != nullptr ? (fs::path(workspace) / path).string() : path;
}

std::string DefaultConfigPath(const std::string& relative) {
  const std::string from_workspace = FromWorkspace(relative);
  if (fs::exists(from_workspace)) return from_workspace;
  // Run outside `bazel run` (bazel-bin/experiments/train_gpt from anywhere):
  // the config ships as a data dependency in the binary's runfiles.
  std::vector<fs::path> runfiles_dirs;
  if (const char* dir = std::getenv("RUNFILES_DIR")) runfiles_dirs.emplace_back(dir);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) runfiles_dirs.push_back(exe.string() + ".runfiles");
  for (const fs::path& dir : runfiles_dirs) {
    if (fs::exists(dir / "pipe" / relative)) return (dir / "pipe" / relative).string();
  }
  return relative;
}

std::string DefaultConfigPath(ModelKind kind) {
  return DefaultConfigPath(kind == ModelKind::kGpt
                               ? "experiments/configs/gpt_small_pp2.textproto"
                               : "experiments/configs/bert_small_pp2.textproto");
}

int WorldSizeFromEnv() {
  const char* world = std::getenv("WORLD_SIZE");
  return world != nullptr ? std::atoi(world) : 0;
}

absl::StatusOr<ExperimentConfig> LoadResolvedConfig(ModelKind kind, int world_size,
                                                    const ExperimentModel* custom) {
  const std::string flag_path = absl::GetFlag(FLAGS_config);
  const std::string path = !flag_path.empty()  ? FromWorkspace(flag_path)
                           : custom != nullptr ? DefaultConfigPath(custom->default_config)
                                               : DefaultConfigPath(kind);
  PP_ASSIGN_OR_RETURN(ExperimentConfig config, LoadExperimentConfig(path));
  for (const std::string& assignment : absl::GetFlag(FLAGS_set)) {
    PP_RETURN_IF_ERROR(ApplyOverride(config, assignment));
  }
  for (const OverrideFlag& o : OverrideFlagTable()) {
    const std::string value = absl::GetFlag(*o.flag);
    if (!value.empty()) PP_RETURN_IF_ERROR(ApplyOverride(config, absl::StrCat(o.path, "=", value)));
  }
  ResolveDefaults(config, kind);
  config.mutable_data()->set_path(FromWorkspace(config.data().path()));
  config.set_output_dir(FromWorkspace(config.output_dir()));
  if (absl::StartsWith(config.parallelism().schedule(), kCsvSchedulePrefix)) {
    config.mutable_parallelism()->set_schedule(absl::StrCat(
        kCsvSchedulePrefix,
        FromWorkspace(config.parallelism().schedule().substr(kCsvSchedulePrefix.size()))));
  }
  if (!config.checkpoint().resume().empty() && config.checkpoint().resume() != "auto") {
    config.mutable_checkpoint()->set_resume(FromWorkspace(config.checkpoint().resume()));
  }
  if (custom != nullptr) {
    PP_ASSIGN_OR_RETURN(std::vector<LayerSpec> specs, custom->specs(config));
    PP_RETURN_IF_ERROR(ValidateExperimentConfig(config, kind, world_size, &specs));
  } else {
    PP_RETURN_IF_ERROR(ValidateExperimentConfig(config, kind, world_size));
  }
  return config;
}

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

// Rank 0's view of progress: a bar redrawn in place on the terminal, or a
// plain line every `log_interval` steps. The launcher forwards workers'
// output line by line, so the bar goes straight to the controlling terminal.
class Progress {
 public:
  Progress(int64_t total, int64_t log_interval) : total_(total), log_interval_(log_interval) {
    if (std::getenv("PP_PROGRESS_TTY") != nullptr) tty_ = std::fopen("/dev/tty", "w");
    start_ = std::chrono::steady_clock::now();
  }
  ~Progress() {
    if (tty_ != nullptr) std::fclose(tty_);
  }

  void Update(int64_t step, double loss, double tokens_per_s, std::optional<double> eval_loss) {
    const double elapsed = Elapsed();
    const double eta =
        elapsed / static_cast<double>(step + 1) * static_cast<double>(total_ - step - 1);
    const std::string stats =
        absl::StrFormat("step %d/%d  loss %.4f  %s tok/s  ETA %s", step + 1, total_, loss,
                        HumanCount(tokens_per_s), FormatDuration(eta));
    if (tty_ != nullptr) {
      constexpr int kBar = 28;
      const int filled = static_cast<int>(kBar * (step + 1) / total_);
      std::fprintf(tty_, "\r[%s%s] %s   ", std::string(filled, '#').c_str(),
                   std::string(kBar - filled, '.').c_str(), stats.c_str());
      if (eval_loss.has_value()) {
        std::fprintf(
            tty_, "%s",
            absl::StrFormat("\n  eval loss %.4f at step %d\n", *eval_loss, step + 1).c_str());
      }
      std::fflush(tty_);
      return;
    }
    if (Logs(step) || eval_loss.has_value()) {
      std::cout << stats
                << (eval_loss.has_value() ? absl::StrFormat("  eval loss %.4f", *eval_loss) : "")
                << std::endl;
    }
  }
  // Whether `step` (0-based) prints a line (an evaluated step does too).
  bool Logs(int64_t step) const {
    return (step + 1) % log_interval_ == 0 || step == 0 || step + 1 == total_;
  }
  void Finish() {
    if (tty_ != nullptr) {
      std::fprintf(tty_, "\n");
      std::fflush(tty_);
    }
  }
  double Elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  static std::string HumanCount(double x) {
    return x >= 1e6   ? absl::StrFormat("%.2fM", x / 1e6)
           : x >= 1e3 ? absl::StrFormat("%.1fk", x / 1e3)
                      : absl::StrFormat("%.0f", x);
  }
  int64_t total_;
  int64_t log_interval_;
  std::FILE* tty_ = nullptr;
  std::chrono::steady_clock::time_point start_;
};

absl::Status WriteFile(const fs::path& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

struct Data {
  std::unique_ptr<MicroBatchSource> train;
  std::unique_ptr<MicroBatchSource> eval;  // null when the held-out part is too small
  int64_t tokens_per_step = 0;             // global
  int64_t corpus_bytes = 0;
  size_t corpus_files = 0;
  std::string description;  // a custom model's, instead of the corpus line
};

absl::StatusOr<Data> MakeCustomData(const ExperimentConfig& config, const ExperimentModel& model) {
  PP_ASSIGN_OR_RETURN(ExperimentData d, model.data(config));
  if (d.train == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", model.name, "' made no training MicroBatchSource"));
  }
  Data data;
  data.train = std::move(d.train);
  data.eval = std::move(d.eval);
  data.tokens_per_step = d.tokens_per_step;
  data.description = std::move(d.description);
  return data;
}

// data.source synthetic: the peer benchmark's arithmetic progressions.
absl::StatusOr<Data> MakeSyntheticData(const ExperimentConfig& config) {
  const auto& par = config.parallelism();
  SyntheticLmOptions o;
  o.lm = {.seq_len = config.gpt().context_length(),
          .micro_batch_size = par.micro_batch_size(),
          .num_microbatches = par.num_microbatches(),
          .dp_rank = 0,
          .dp_size = par.dp(),
          .seed = config.seed()};
  Data data;
  PP_ASSIGN_OR_RETURN(SyntheticLmBatchSource train, SyntheticLmBatchSource::Create(o));
  data.tokens_per_step = train.global_tokens_per_step();
  data.train = std::make_unique<SyntheticLmBatchSource>(std::move(train));
  o.lm.seed = config.seed() + 1;
  PP_ASSIGN_OR_RETURN(SyntheticLmBatchSource eval, SyntheticLmBatchSource::Create(o));
  data.eval = std::make_unique<SyntheticLmBatchSource>(std::move(eval));
  data.description = "synthetic data (arithmetic progressions of byte tokens)";
  return data;
}

absl::StatusOr<Data> MakeData(const ExperimentConfig& config, ModelKind kind) {
  if (config.data().source() == "synthetic") return MakeSyntheticData(config);
  PP_ASSIGN_OR_RETURN(Corpus corpus, LoadCorpus(config.data().path()));
  const auto& par = config.parallelism();
  Data data;
  data.corpus_bytes = static_cast<int64_t>(corpus.text.size());
  data.corpus_files = corpus.files.size();
  const size_t eval_bytes = static_cast<size_t>(corpus.text.size() * config.data().eval_fraction());
  const std::string train_text = corpus.text.substr(0, corpus.text.size() - eval_bytes);
  const std::string eval_text = corpus.text.substr(corpus.text.size() - eval_bytes);
  if (kind == ModelKind::kGpt) {
    LmDataOptions o{.seq_len = config.gpt().context_length(),
                    .micro_batch_size = par.micro_batch_size(),
                    .num_microbatches = par.num_microbatches(),
                    .dp_rank = 0,
                    .dp_size = par.dp(),
                    .seed = config.seed()};
    PP_ASSIGN_OR_RETURN(LmBatchSource train,
                        LmBatchSource::Create(ByteTokenizer::Encode(train_text), o));
    data.tokens_per_step = train.global_tokens_per_step();
    data.train = std::make_unique<LmBatchSource>(std::move(train));
    o.seed = config.seed() + 1;
    absl::StatusOr<LmBatchSource> eval = LmBatchSource::Create(ByteTokenizer::Encode(eval_text), o);
    if (eval.ok()) data.eval = std::make_unique<LmBatchSource>(*std::move(eval));
  } else {
    MlmDataOptions o{.seq_len = config.bert().context_length(),
                     .micro_batch_size = par.micro_batch_size(),
                     .num_microbatches = par.num_microbatches(),
                     .dp_rank = 0,
                     .dp_size = par.dp(),
                     .seed = config.seed(),
                     .mask_prob = config.bert().mask_prob()};
    PP_ASSIGN_OR_RETURN(MlmBatchSource train, MlmBatchSource::Create(train_text, o));
    data.train = std::make_unique<MlmBatchSource>(std::move(train));
    o.seed = config.seed() + 1;
    absl::StatusOr<MlmBatchSource> eval = MlmBatchSource::Create(eval_text, o);
    if (eval.ok()) data.eval = std::make_unique<MlmBatchSource>(*std::move(eval));
    data.tokens_per_step = static_cast<int64_t>(par.dp()) * par.num_microbatches() *
                           par.micro_batch_size() * config.bert().context_length();
  }
  return data;
}

// The named steps of RunExperiment, each on the state the earlier ones built.

// Rendezvous and the pipe x data grid. The World outlives the grid's groups.
struct Cluster {
  World world;
  std::unique_ptr<ParallelGrid> grid;
};

absl::StatusOr<Cluster> JoinCluster(const experiments::ParallelismConfig& par,
                                    std::chrono::milliseconds timeout) {
  RendezvousOptions ro;
  ro.timeout = timeout;
  PP_ASSIGN_OR_RETURN(ro.device, ParseDeviceKind(par.device()));
  Cluster cluster;
  PP_ASSIGN_OR_RETURN(cluster.world, RendezvousFromEnv(ro));
  PP_ASSIGN_OR_RETURN(ProcessTopology topology, PipeDataParallelTopology(par.pp(), par.dp()));
  PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(cluster.world, topology));
  cluster.grid = std::make_unique<ParallelGrid>(std::move(grid));
  return cluster;
}

// The partition method every rank builds its stage with. `profile` times the
// layers, so ranks would disagree on the bounds: global rank 0 profiles every
// layer on the training data's first micro-batch and broadcasts the bounds
// over the world group; every rank then cuts by `explicit:<bounds>`. The
// broadcast carries rank 0's success, so a failed profile fails every rank
// with rank 0's reason instead of leaving them to time out.
absl::StatusOr<std::string> ResolvePartitionMethod(const ExperimentConfig& config,
                                                   const std::vector<LayerSpec>& specs,
                                                   MicroBatchSource& train, ParallelGrid& grid,
                                                   std::chrono::milliseconds timeout) {
  const auto& par = config.parallelism();
  const std::string& method = par.partition_method();
  if (method.substr(0, method.find(':')) != "profile") return method;
  const int64_t parts = par.pp() * par.chunks();
  // [ok, b_0, ..., b_parts]
  std::vector<at::Tensor> shared = {torch::zeros({parts + 2}, torch::kLong)};
  absl::Status profiled = absl::OkStatus();
  if (grid.global_rank() == 0) {
    absl::StatusOr<Bounds> bounds = [&]() -> absl::StatusOr<Bounds> {
      PP_ASSIGN_OR_RETURN(MicroBatchData sample, train.Get(0, 0));
      PartitionRequest request;
      request.specs = &specs;
      request.num_parts = parts;
      request.base_seed = config.seed();
      request.sample_inputs = std::move(sample.inputs);
      request.sample_batch = std::move(sample.batch);
      return Partition(method, request);
    }();
    if (bounds.ok() && static_cast<int64_t>(bounds->size()) != parts + 1) {
      bounds = absl::InternalError(absl::StrCat("the profile partitioner returned ", bounds->size(),
                                                " bounds for ", parts, " parts"));
    }
    profiled = bounds.status();
    if (bounds.ok()) {
      auto b = shared[0].accessor<int64_t, 1>();
      b[0] = 1;
      for (int64_t i = 0; i <= parts; ++i) b[i + 1] = (*bounds)[i];
    }
  }
  PP_RETURN_IF_ERROR(RunCollective("partition bounds broadcast", grid.DescribeWorldGroup(), timeout,
                                   [&] { return grid.world_group()->broadcast(shared); }));
  if (!profiled.ok()) {
    return absl::Status(profiled.code(), absl::StrCat("parallelism.partition_method 'profile': ",
                                                      profiled.message()));
  }
  auto b = shared[0].accessor<int64_t, 1>();
  if (b[0] != 1) {
    return absl::FailedPreconditionError(
        "parallelism.partition_method 'profile': rank 0 could not profile the model (its log "
        "names the reason)");
  }
  std::vector<int64_t> bounds;
  for (int64_t i = 0; i <= parts; ++i) bounds.push_back(b[i + 1]);
  const std::string resolved = absl::StrCat("explicit:", absl::StrJoin(bounds, ","));
  LOG(INFO) << "partition '" << method
            << "' measured by rank 0 on the first training micro-batch: " << resolved;
  return resolved;
}

// This rank's stage of the model the config names, cut by `partition_method`
// (ResolvePartitionMethod).
absl::StatusOr<std::unique_ptr<PipelineModel>> BuildStage(const ExperimentConfig& config,
                                                          const std::vector<LayerSpec>& specs,
                                                          const std::string& partition_method,
                                                          int stage) {
  const auto& par = config.parallelism();
  PipelineModelOptions mo;
  mo.num_stages = par.pp();
  mo.chunks = par.chunks();
  mo.partition_method = partition_method;
  mo.base_seed = config.seed();
  // The schedule's placement (V for zbv); its errors are the Trainer's to report.
  if (absl::StatusOr<Schedule> schedule = MakeSchedule(
          par.schedule(), {static_cast<int>(par.pp()), static_cast<int>(par.num_microbatches()),
                           static_cast<int>(par.chunks()), 0});
      schedule.ok()) {
    mo.stage_to_rank = schedule->stage_to_rank;
  }
  return PipelineModel::Create(specs, mo, stage);
}

// The Trainer's options from the config's parallelism, optimizer, LR schedule
// and activation checkpointing.
absl::StatusOr<TrainerOptions> MakeTrainerOptions(const ExperimentConfig& config,
                                                  std::chrono::milliseconds timeout) {
  const auto& par = config.parallelism();
  TrainerOptions to;
  to.schedule = par.schedule();
  to.num_microbatches = par.num_microbatches();
  to.skip_nonfinite_updates = config.nonfinite().policy() == "skip";
  to.optimizer = ToOptimizerConfig(config);
  to.lr_schedule = ToLrScheduleConfig(config);
  to.max_grad_norm = config.optimizer().max_grad_norm();
  to.executor.p2p.timeout = timeout;
  to.executor.p2p.static_shapes = par.p2p_static_shapes();
  to.executor.post_receives_ahead = par.p2p_post_receives_ahead();
  if (par.activation_checkpointing().interval() > 0) {
    ActivationCheckpointPolicy policy;
    policy.interval = par.activation_checkpointing().interval();
    policy.checkpointable_types = par.activation_checkpointing().checkpointable_types();
    PP_ASSIGN_OR_RETURN(to.layer_runner, MakeCheckpointingRunner(policy));
  }
  return to;
}

// Model checkpoints (checkpoint/model/trainer_checkpoint.h): where they go,
// how often, how many are kept, what to resume from.
CheckpointPolicy MakeCheckpointPolicy(const ExperimentConfig& config) {
  CheckpointPolicy policy;
  policy.dir = config.checkpoint().dir().empty()
                   ? (fs::path(config.output_dir()) / "checkpoints" / config.name()).string()
                   : FromWorkspace(config.checkpoint().dir());
  policy.save_interval = config.checkpoint().save_interval();
  policy.keep_last = config.checkpoint().keep_last();
  policy.resume = config.checkpoint().resume();
  policy.config = ConfigToText(config);
  policy.seed = static_cast<int64_t>(config.seed());
  // Resuming under another model, seed or optimizer is refused, field by field.
  policy.check_manifest = [config](const checkpoint::Manifest& manifest) {
    std::vector<std::string> warnings;
    absl::Status status = CheckResumeConfig(manifest.config(), config, &warnings);
    for (const std::string& w : warnings) LOG(WARNING) << w;
    return status;
  };
  return policy;
}

// Rank 0's outputs: the run directory (config, metrics.jsonl, trace, sample,
// loss curve) and the console report. Other ranks hold an inactive one.
class RunReport {
 public:
  static absl::StatusOr<RunReport> Open(const ExperimentConfig& config,
                                        const std::string& model_name, bool rank0) {
    RunReport report(config, model_name);
    if (!rank0) return report;
    report.dir_ = fs::path(config.output_dir()) /
                  absl::StrCat(config.name(), "-",
                               absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::UTCTimeZone()));
    std::error_code ec;
    fs::create_directories(report.dir_, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot create run directory ", report.dir_.string(), ": ", ec.message()));
    }
    PP_RETURN_IF_ERROR(WriteFile(report.dir_ / "config.textproto", ConfigToText(config)));
    report.metrics_ = std::make_unique<std::ofstream>(report.dir_ / "metrics.jsonl");
    return report;
  }

  bool active() const { return metrics_ != nullptr; }
  const fs::path& dir() const { return dir_; }
  // TensorBoard, memory and the rest of run_observability.h (every rank).
  void set_observability(RunObservability* obs) { obs_ = obs; }

  // `custom`: the data describes itself (a user's model), else the corpus.
  void Header(const Data& data, const PipelineModel& model, bool custom) const {
    if (!active()) return;
    const auto& par = config_->parallelism();
    std::cout << absl::StrFormat(
                     "%s: %s, pp=%d x dp=%d, schedule %s, chunks %d, %d micro-batches of %d; "
                     "%s; %d tokens/step\n",
                     config_->name(), model_name_, par.pp(), par.dp(), par.schedule(), par.chunks(),
                     par.num_microbatches(), par.micro_batch_size(),
                     custom || !data.description.empty()
                         ? data.description
                         : absl::StrFormat("corpus %s (%d files, %d bytes)", config_->data().path(),
                                           data.corpus_files, data.corpus_bytes),
                     data.tokens_per_step)
              << model.PartitionReport() << "run directory: " << dir_.string() << std::endl;
  }

  // One metrics line, the loss curves and the progress display.
  absl::Status Step(int64_t step, const StepResult& r, double tokens_per_s, double seconds,
                    std::optional<double> eval_loss, const StepMemory& memory, Progress& progress) {
    if (!active()) return absl::OkStatus();
    nlohmann::json line = {{"step", step + 1},
                           {"loss", r.loss},
                           {"lr", r.learning_rate},
                           {"grad_norm", r.grad_norm},
                           {"tokens_per_s", tokens_per_s},
                           {"step_s", seconds}};
    if (eval_loss.has_value()) line["eval_loss"] = *eval_loss;
    if (!r.busy_seconds.empty()) {  // an observed step (TrainLoop)
      std::vector<double> bubble;
      for (size_t i = 0; i < r.busy_seconds.size(); ++i) {
        const double wall = r.busy_seconds[i] + r.idle_seconds[i];
        bubble.push_back(wall > 0 ? r.idle_seconds[i] / wall : 0.0);
      }
      line["bubble"] = bubble;
    }
    PP_RETURN_IF_ERROR(obs_->Metrics(line, memory));  // memory, time; TensorBoard
    *metrics_ << line.dump() << "\n" << std::flush;
    train_curve_.emplace_back(step + 1, r.loss);
    if (eval_loss.has_value()) eval_curve_.emplace_back(step + 1, *eval_loss);
    progress.Update(step, r.loss, tokens_per_s, eval_loss);
    return absl::OkStatus();
  }

  // trace.json for the first traced step (`first`); with trace_steps > 1 also
  // traces/step_<step>.json for every traced step (0-based, as trace_step).
  absl::Status Trace(int64_t step, bool first, const std::string& trace) const {
    if (!active()) return absl::OkStatus();
    if (config_->trace_steps() > 1) {
      std::error_code ec;
      std::filesystem::create_directories(dir_ / "traces", ec);
      if (ec) {
        return absl::InternalError(
            absl::StrCat("cannot create ", (dir_ / "traces").string(), ": ", ec.message()));
      }
      PP_RETURN_IF_ERROR(WriteFile(dir_ / "traces" / absl::StrCat("step_", step, ".json"), trace));
    }
    if (!first) return absl::OkStatus();
    return WriteFile(dir_ / "trace.json", trace);
  }

  absl::Status Sample(const std::string& text) const {
    if (!active()) return absl::OkStatus();
    PP_RETURN_IF_ERROR(WriteFile(dir_ / "sample.txt", text + "\n"));
    PP_RETURN_IF_ERROR(obs_->Text("sample", config_->steps(), text));
    std::cout << "sample (top-" << config_->sample_top_k() << ", " << config_->sample_tokens()
              << " bytes):\n"
              << text << "\n"
              << std::endl;
    return absl::OkStatus();
  }

  // loss.svg and the closing line.
  absl::Status Finish(double train_seconds, const std::string& memory_summary) const {
    if (!active()) return absl::OkStatus();
    std::cout << memory_summary;
    const auto& par = config_->parallelism();
    PP_RETURN_IF_ERROR(
        WriteFile(dir_ / "loss.svg",
                  LossCurveSvg(absl::StrCat(config_->name(), ": ", model_name_, " pp=", par.pp(),
                                            " dp=", par.dp(), " ", par.schedule()),
                               train_curve_, eval_curve_)));
    if (train_curve_.empty()) return absl::OkStatus();
    std::cout << absl::StrFormat("done: %d steps in %s, loss %.4f -> %.4f%s\nrun directory: %s\n",
                                 config_->steps(), FormatDuration(train_seconds),
                                 train_curve_.front().second, train_curve_.back().second,
                                 eval_curve_.empty() ? ""
                                                     : absl::StrFormat(", eval loss %.4f",
                                                                       eval_curve_.back().second),
                                 dir_.string())
              << std::flush;
    return absl::OkStatus();
  }

 private:
  RunReport(const ExperimentConfig& config, const std::string& model_name)
      : config_(&config), model_name_(model_name) {}

  const ExperimentConfig* config_;
  std::string model_name_;
  fs::path dir_;
  std::unique_ptr<std::ofstream> metrics_;  // null on ranks other than 0
  RunObservability* obs_ = nullptr;
  LossPoints train_curve_, eval_curve_;
};

// Mean loss over the config's eval batches (a forward-only schedule).
absl::StatusOr<double> Evaluate(const ExperimentConfig& config, Trainer& trainer,
                                MicroBatchSource* eval) {
  double sum = 0;
  for (int64_t i = 0; i < config.eval_batches(); ++i) {
    PP_ASSIGN_OR_RETURN(double loss, trainer.Evaluate(eval, i));
    sum += loss;
  }
  return sum / static_cast<double>(config.eval_batches());
}

// Steps from the trainer's current step to config.steps(): save checkpoints,
// evaluate, trace one step, report. Returns the training wall time.
absl::StatusOr<double> TrainLoop(const ExperimentConfig& config, const ParallelGrid& grid,
                                 PipelineModel& model, Trainer& trainer,
                                 TrainingCheckpointer& checkpointer, const Data& data,
                                 RunReport& report, RunObservability& obs) {
  Progress progress(config.steps(), config.log_interval());
  const int64_t trace_step = std::min(config.trace_step(), config.steps() - 1);
  NonFiniteGuard nonfinite(config.nonfinite());
  for (int64_t step = trainer.step(); step < config.steps(); ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool last = step + 1 == config.steps();
    const bool evaluates =
        data.eval != nullptr &&
        (last || (config.eval_interval() > 0 && (step + 1) % config.eval_interval() == 0));
    const bool traced = step >= trace_step && step < trace_step + config.trace_steps();
    // Busy/idle and memory figures (two world all-gathers, and on a device
    // waits for it) only on the steps that show them; a profiled step also
    // keeps its actions' times.
    const bool observed = progress.Logs(step) || evaluates || traced;
    const bool profiled = obs.Profiles(step + 1);
    PP_RETURN_IF_ERROR(obs.BeforeStep(step + 1, trainer));
    PP_ASSIGN_OR_RETURN(StepResult r,
                        trainer.Step({.trace = traced || profiled, .busy_idle = observed}));
    PP_ASSIGN_OR_RETURN(StepMemory memory, obs.AfterStep(step + 1, trainer, observed));
    // Before the save: a non-finite state is never checkpointed.
    PP_RETURN_IF_ERROR(nonfinite.AfterStep(r, grid, model, trainer.options().executor.p2p.timeout));
    PP_ASSIGN_OR_RETURN(std::string saved,
                        checkpointer.AfterStep(grid, model, trainer, config.steps()));
    if (!saved.empty() && report.active()) LOG(INFO) << "checkpoint " << saved;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::optional<double> eval_loss;
    if (evaluates) {
      PP_ASSIGN_OR_RETURN(eval_loss, Evaluate(config, trainer, data.eval.get()));
    }
    if (traced) {
      PP_ASSIGN_OR_RETURN(std::string trace, trainer.LastStepTrace());
      PP_RETURN_IF_ERROR(report.Trace(step, step == trace_step, trace));
    }
    const double tokens_per_s = static_cast<double>(data.tokens_per_step) / seconds;
    PP_RETURN_IF_ERROR(report.Step(step, r, tokens_per_s, seconds, eval_loss, memory, progress));
  }
  progress.Finish();
  return progress.Elapsed();
}

// GPT only: sample_tokens bytes from the prompt through the pipeline.
absl::Status SampleText(const ExperimentConfig& config, ParallelGrid& grid,
                        PipelineSampler& sampler, Trainer& trainer,
                        std::chrono::milliseconds timeout, const RunReport& report) {
  SampleOptions so{.num_tokens = config.sample_tokens(),
                   .top_k = config.sample_top_k(),
                   .temperature = config.sample_temperature(),
                   .seed = config.seed(),
                   .max_token_id = ByteTokenizer::kNumBytes};
  PP_ASSIGN_OR_RETURN(
      std::vector<int64_t> tokens,
      Generate(ByteTokenizer::Encode(config.sample_prompt()), config.gpt().context_length(), so,
               sampler.LogitsFn(&trainer, &grid, ByteTokenizer::kVocabSize, timeout)));
  return report.Sample(ByteTokenizer::Decode(tokens));
}

}  // namespace

absl::Status RunExperiment(const ExperimentConfig& config, ModelKind kind,
                           const ExperimentModel* custom) {
  if ((kind == ModelKind::kCustom) != (custom != nullptr)) {
    return absl::InternalError("RunExperiment: a custom model (only) needs its ExperimentModel");
  }
  const std::string model_name = custom != nullptr ? custom->name : ModelKindName(kind);
  const std::chrono::milliseconds timeout(int64_t{1000} * config.parallelism().timeout_seconds());
  PP_ASSIGN_OR_RETURN(Cluster cluster, JoinCluster(config.parallelism(), timeout));
  ParallelGrid& grid = *cluster.grid;
  PP_ASSIGN_OR_RETURN(Data data,
                      custom != nullptr ? MakeCustomData(config, *custom) : MakeData(config, kind));
  PP_ASSIGN_OR_RETURN(std::vector<LayerSpec> specs, custom != nullptr
                                                        ? custom->specs(config)
                                                        : MakeExperimentSpecs(config, kind));
  PP_ASSIGN_OR_RETURN(const std::string partition_method,
                      ResolvePartitionMethod(config, specs, *data.train, grid, timeout));
  PP_ASSIGN_OR_RETURN(std::unique_ptr<PipelineModel> model,
                      BuildStage(config, specs, partition_method, grid.stage_id()));
  // GPT: the loss also keeps the last stage's logits for sampling.
  PipelineSampler sampler;
  const LossFn loss_fn = custom != nullptr         ? custom->loss
                         : kind == ModelKind::kGpt ? sampler.WrapLoss(GptLoss)
                                                   : LossFn(BertMlmLoss);
  PP_ASSIGN_OR_RETURN(TrainerOptions to, MakeTrainerOptions(config, timeout));
  // --device=cuda: weights on cuda:<LOCAL_RANK>; the Trainer moves the
  // micro-batches and keeps p2p and its collectives there (NCCL).
  to.executor.p2p.device = cluster.world.device;
  PP_RETURN_IF_ERROR(
      TorchCall("moving the model to its device", [&] { model->to(to.executor.p2p.device); }));
  PP_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                      Trainer::Create(&grid, model.get(), loss_fn, data.train.get(), to));
  // The actions' observers: the launcher's status page, --v=1's action lines.
  WorkerStatusObserver worker_status;
  ActionLog action_log;
  ActionObservers action_observers(
      {WorkerStatusEnabled() ? &worker_status : nullptr, VLOG_IS_ON(1) ? &action_log : nullptr});
  if (!action_observers.empty()) trainer->set_action_observer(&action_observers);
  // Each rank's dropout stream starts from the config's seed, so a run is
  // repeatable and a resumed one (which restores the saved RNG state) exact.
  torch::manual_seed(config.seed() * 1000003ULL + static_cast<uint64_t>(grid.global_rank()));

  const bool rank0 = grid.global_rank() == 0;
  CheckpointPolicy ckpt_policy = MakeCheckpointPolicy(config);
  ckpt_policy.before_save = [&grid, &model, &trainer, timeout] {
    return CheckWeightsFinite(grid, *model, trainer->step(), timeout);
  };
  PP_ASSIGN_OR_RETURN(TrainingCheckpointer checkpointer, TrainingCheckpointer::Create(ckpt_policy));
  PP_ASSIGN_OR_RETURN(bool resumed, checkpointer.MaybeResume(grid, *model, *trainer));
  if (resumed && rank0) {
    std::cout << "resumed at step " << trainer->step() << " from " << ckpt_policy.resume
              << std::endl;
  }
  PP_ASSIGN_OR_RETURN(RunReport report, RunReport::Open(config, model_name, rank0));
  PP_ASSIGN_OR_RETURN(std::unique_ptr<RunObservability> obs,
                      RunObservability::Create(config, grid, report.dir().string(), timeout));
  report.set_observability(obs.get());
  report.Header(data, *model, custom != nullptr);
  PP_ASSIGN_OR_RETURN(double train_seconds,
                      TrainLoop(config, grid, *model, *trainer, checkpointer, data, report, *obs));
  if (rank0) {
    const P2PStats p2p = trainer->p2p_stats();
    std::cout << "p2p (rank 0): " << p2p.tensor_messages << " messages sent, "
              << p2p.control_messages << " activation control words, " << p2p.static_payloads
              << " activations as payload only (static shapes "
              << (config.parallelism().p2p_static_shapes() ? "on" : "off") << "), "
              << p2p.payloads_posted_ahead << " payloads and " << p2p.controls_posted_ahead
              << " control words received into receives posted ahead (post receives ahead "
              << (config.parallelism().p2p_post_receives_ahead() ? "on" : "off") << ")"
              << std::endl;
  }
  if (kind == ModelKind::kGpt && config.sample_tokens() > 0) {
    PP_RETURN_IF_ERROR(SampleText(config, grid, sampler, *trainer, timeout, report));
  }
  PP_ASSIGN_OR_RETURN(std::string memory_summary, obs->Finish(*trainer));
  return report.Finish(train_seconds, memory_summary);
}

namespace {

// Launcher side: the config's threads reach the workers as the launcher's
// PP_INTRA_OP_THREADS / PP_BLAS_THREADS (its flags still win), unless the
// person running it set those variables themselves.
void ExportThreadConfig(const experiments::ThreadsConfig& threads) {
  if (threads.intra_op() > 0) {
    setenv("PP_INTRA_OP_THREADS", std::to_string(threads.intra_op()).c_str(), /*overwrite=*/0);
  }
  if (threads.blas() > 0) {
    setenv("PP_BLAS_THREADS", std::to_string(threads.blas()).c_str(), /*overwrite=*/0);
  }
}

int ExperimentMain(int argc, char** argv, ModelKind kind, const ExperimentModel* custom) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  // The launcher forwards worker output line by line; tell rank 0 whether a
  // person is watching, so it can draw its progress bar on the terminal.
  if (std::getenv("RANK") == nullptr && isatty(STDOUT_FILENO)) setenv("PP_PROGRESS_TTY", "1", 1);
  MaybeLaunch(argc, argv, [kind, custom, argc, argv] {
    // Launcher side (also with --nproc_per_node given): a bad config, data
    // path, output_dir or command line fails here, before any worker starts
    // (experiments/preflight.h).
    const int nproc = absl::GetFlag(FLAGS_nproc_per_node);
    const int world_size = nproc > 0 ? nproc * absl::GetFlag(FLAGS_nnodes) : 0;
    // A repeated flag first: only its last use reached the config, so an
    // error about the config would name the wrong value.
    absl::Status repeated = CheckNoRepeatedFlags({argv, argv + argc});
    absl::StatusOr<ExperimentConfig> config = repeated.ok()
                                                  ? LoadResolvedConfig(kind, world_size, custom)
                                                  : absl::StatusOr<ExperimentConfig>(repeated);
    if (absl::Status s = config.ok() ? Preflight(*config, {argv, argv + argc}) : absl::OkStatus();
        s.ok() && config.ok()) {
      s = ProfileStepsFor(*config).status();
      if (!s.ok()) config = absl::StatusOr<ExperimentConfig>(s);
    } else if (!s.ok()) {
      config = absl::StatusOr<ExperimentConfig>(s);
    }
    if (!config.ok()) {
      std::cerr << "error: " << config.status().message() << std::endl;
      std::exit(2);
    }
    ExportThreadConfig(config->threads());
    return config->parallelism().pp() * config->parallelism().dp();
  });
  // Worker: memory tracking before anything is allocated; glog to the rank's
  // log file (opened once the run directory is known), warnings+ on stderr.
  if (absl::Status s = StartWorkerObservability(); !s.ok()) {
    std::cerr << "error: " << s << std::endl;
    return 1;
  }
  absl::StatusOr<ExperimentConfig> config = LoadResolvedConfig(kind, WorldSizeFromEnv(), custom);
  if (!config.ok()) {
    std::cerr << "error: " << config.status().message() << std::endl;
    return 2;
  }
  absl::Status status = RunExperiment(*config, kind, custom);
  if (!status.ok()) {
    LogErrorToRankLogOnly(status.ToString());  // printed below
    StopRankLogging();
    std::cerr << "error: " << status << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace

int ExperimentMain(int argc, char** argv, ModelKind kind) {
  return ExperimentMain(argc, argv, kind, nullptr);
}

int ExperimentMain(int argc, char** argv, const ExperimentModel& model) {
  return ExperimentMain(argc, argv, ModelKind::kCustom, &model);
}

}  // namespace pp
