#include "driver/experiment_main.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "driver/experiment_config.h"
#include "driver/preflight.h"
#include "driver/run_experiment.h"
#include "driver/run_observability.h"
#include "driver/save_on_signal.h"
#include "driver/workspace_path.h"
#include "observability/rank_log.h"
#include "pipeline/schedule/formats/csv.h"
#include "topology/launcher.h"

ABSL_FLAG(std::string, config, "",
          "ExperimentConfig text proto, relative to the workspace; default: the binary's own "
          "(train_gpt: experiments/configs/gpt_small_pp2.textproto)");
ABSL_FLAG(std::vector<std::string>, set, {},
          "field overrides, comma-separated: --set=optimizer.lr=1e-3,steps=50");
ABSL_FLAG(std::string, pp, "", "override parallelism.pp (pipeline stages)");
ABSL_FLAG(std::string, dp, "", "override parallelism.dp (data-parallel replicas)");
ABSL_FLAG(std::string, tp, "", "override parallelism.tp (tensor-parallel ranks per stage)");
ABSL_FLAG(std::string, sequence_parallel, "",
          "override parallelism.sequence_parallel (true: norms, dropout and p2p on sequence "
          "shards; needs --tp > 1)");
ABSL_FLAG(std::string, distributed_optimizer, "",
          "override parallelism.distributed_optimizer (true: optimizer state sharded over the "
          "data-parallel ranks, ZeRO-1)");
ABSL_FLAG(std::string, vocab_parallel, "",
          "override parallelism.vocab_parallel (true: the token embedding and the LM head split "
          "by vocabulary over every pipeline rank, their passes in the schedule)");
ABSL_FLAG(std::string, vocab_barriers, "",
          "override parallelism.vocab_barriers (1 or 2: the output algorithm of the vocabulary "
          "passes pipe places into a schedule; 0: pipe's choice)");
ABSL_FLAG(std::string, vocab_async_collectives, "",
          "override parallelism.vocab_async_collectives (true: the vocabulary passes' "
          "collectives run asynchronously, each waited for where its result is read; the same "
          "bits)");
ABSL_FLAG(std::string, schedule, "", "override parallelism.schedule");
ABSL_FLAG(std::string, auto_costs, "",
          "override parallelism.auto_costs (--schedule=auto synthesises for these costs instead "
          "of measuring, e.g. F:1,I:1,W:1; --set cannot carry its commas)");
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
ABSL_FLAG(std::string, borrow_idle_cores, "",
          "override threads.borrow_idle_cores (true: an action during which the schedule keeps "
          "this rank's pipeline peers on the machine waiting uses their cores for its matrix "
          "products; CPU, OpenBLAS)");
ABSL_FLAG(std::string, transport_thread_nice, "",
          "override parallelism.transport_thread_nice (0-19: nice value of each rank's Gloo "
          "transport thread)");
ABSL_FLAG(std::string, ranks_per_device, "",
          "override parallelism.ranks_per_device (local ranks per GPU with --device=cuda; above 1 "
          "ranks share GPUs through host buffers and Gloo: tests and small experiments)");
ABSL_FLAG(std::string, precision, "",
          "override precision (fp32, or bf16: bf16 parameters and activations with fp32 master "
          "weights, gradient accumulation and loss)");
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
ABSL_FLAG(std::string, save_on_signal, "",
          "override checkpoint.save_on_signal (true: on SIGTERM, finish the step, save a "
          "checkpoint and exit 143)");

namespace pp {
namespace {

constexpr char kOpenBlasThreadTimeoutVariable[] = "OPENBLAS_THREAD_TIMEOUT";
constexpr char kBorrowedThreadTimeout[] = "4";

struct OverrideFlag {
  absl::Flag<std::string>* flag;
  const char* path;
};

const std::vector<OverrideFlag>& OverrideFlagTable() {
  static const auto* table = new std::vector<OverrideFlag>{
      {&FLAGS_pp, "parallelism.pp"},
      {&FLAGS_dp, "parallelism.dp"},
      {&FLAGS_tp, "parallelism.tp"},
      {&FLAGS_sequence_parallel, "parallelism.sequence_parallel"},
      {&FLAGS_distributed_optimizer, "parallelism.distributed_optimizer"},
      {&FLAGS_vocab_parallel, "parallelism.vocab_parallel"},
      {&FLAGS_vocab_barriers, "parallelism.vocab_barriers"},
      {&FLAGS_vocab_async_collectives, "parallelism.vocab_async_collectives"},
      {&FLAGS_schedule, "parallelism.schedule"},
      {&FLAGS_auto_costs, "parallelism.auto_costs"},
      {&FLAGS_chunks, "parallelism.chunks"},
      {&FLAGS_microbatches, "parallelism.num_microbatches"},
      {&FLAGS_micro_batch_size, "parallelism.micro_batch_size"},
      {&FLAGS_partition, "parallelism.partition_method"},
      {&FLAGS_ckpt_interval, "parallelism.activation_checkpointing.interval"},
      {&FLAGS_device, "parallelism.device"},
      {&FLAGS_p2p_static_shapes, "parallelism.p2p_static_shapes"},
      {&FLAGS_p2p_post_receives_ahead, "parallelism.p2p_post_receives_ahead"},
      {&FLAGS_transport_thread_nice, "parallelism.transport_thread_nice"},
      {&FLAGS_borrow_idle_cores, "threads.borrow_idle_cores"},
      {&FLAGS_ranks_per_device, "parallelism.ranks_per_device"},
      {&FLAGS_precision, "precision"},
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
      {&FLAGS_save_on_signal, "checkpoint.save_on_signal"},
  };
  return *table;
}

int WorldSizeFromEnv() {
  const char* world = std::getenv("WORLD_SIZE");
  return world != nullptr ? std::atoi(world) : 0;
}

absl::StatusOr<ExperimentConfig> LoadResolvedConfig(const std::string& default_config,
                                                    int world_size) {
  const std::string flag_path = absl::GetFlag(FLAGS_config);
  const std::string path =
      !flag_path.empty() ? FromWorkspace(flag_path) : FindShippedFile(default_config);
  PP_ASSIGN_OR_RETURN(ExperimentConfig config, LoadExperimentConfig(path));
  std::vector<CommandLineOverride> overrides;
  for (const std::string& assignment : absl::GetFlag(FLAGS_set)) {
    overrides.push_back({absl::StrCat("--set=", assignment), assignment});
  }
  for (const OverrideFlag& o : OverrideFlagTable()) {
    const std::string value = absl::GetFlag(*o.flag);
    if (value.empty()) continue;
    overrides.push_back(
        {absl::StrCat("--", absl::GetFlagReflectionHandle(*o.flag).Name(), "=", value),
         absl::StrCat(o.path, "=", value)});
  }
  PP_RETURN_IF_ERROR(CheckOneValuePerField(overrides));
  for (const CommandLineOverride& o : overrides)
    PP_RETURN_IF_ERROR(ApplyOverride(config, o.assignment));
  ResolveDefaults(config);
  config.mutable_data()->set_path(FromWorkspace(config.data().path()));
  config.set_output_dir(FromWorkspace(config.output_dir()));
  if (absl::StartsWith(config.parallelism().schedule(), kCsvSchedulePrefix)) {
    config.mutable_parallelism()->set_schedule(absl::StrCat(
        kCsvSchedulePrefix,
        FromWorkspace(config.parallelism().schedule().substr(kCsvSchedulePrefix.size()))));
  }
  if (!config.checkpoint().dir().empty()) {
    config.mutable_checkpoint()->set_dir(FromWorkspace(config.checkpoint().dir()));
  }
  if (!config.checkpoint().resume().empty() && config.checkpoint().resume() != "auto") {
    config.mutable_checkpoint()->set_resume(FromWorkspace(config.checkpoint().resume()));
  }
  PP_RETURN_IF_ERROR(ValidateExperimentConfig(config, world_size));
  return config;
}

// Launcher side: the config's threads reach the workers as the launcher's
// PP_INTRA_OP_THREADS / PP_BLAS_THREADS (its flags still win), unless the
// person running it set those variables themselves. With borrow_idle_cores,
// OpenBLAS's idle workers sleep at once (OPENBLAS_THREAD_TIMEOUT=4, 2^4
// cycles) instead of yielding in a loop for ~0.1 s after each product, which
// would take the core back from the peer the action borrowed it from.
void ExportThreadConfig(const driver::ThreadsConfig& threads) {
  if (threads.borrow_idle_cores()) {
    setenv(kOpenBlasThreadTimeoutVariable, kBorrowedThreadTimeout, /*overwrite=*/0);
  }
  if (threads.intra_op() > 0) {
    setenv("PP_INTRA_OP_THREADS", std::to_string(threads.intra_op()).c_str(), /*overwrite=*/0);
  }
  if (threads.blas() > 0) {
    setenv("PP_BLAS_THREADS", std::to_string(threads.blas()).c_str(), /*overwrite=*/0);
  }
}

int Main(int argc, char** argv, const std::string& default_config) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  // The launcher forwards worker output line by line; tell rank 0 whether a
  // person is watching, so it can draw its progress bar on the terminal.
  if (std::getenv("RANK") == nullptr && isatty(STDOUT_FILENO)) setenv("PP_PROGRESS_TTY", "1", 1);
  MaybeLaunch(argc, argv, [&default_config, argc, argv] {
    // Launcher side (also with --nproc_per_node given): a bad config, data
    // path, output_dir or command line fails here, before any worker starts
    // (driver/preflight.h).
    const int nproc = absl::GetFlag(FLAGS_nproc_per_node);
    const int world_size = nproc > 0 ? nproc * absl::GetFlag(FLAGS_nnodes) : 0;
    // A repeated flag first: only its last use reached the config, so an
    // error about the config would name the wrong value.
    absl::Status repeated = CheckNoRepeatedFlags({argv, argv + argc});
    absl::StatusOr<ExperimentConfig> config = repeated.ok()
                                                  ? LoadResolvedConfig(default_config, world_size)
                                                  : absl::StatusOr<ExperimentConfig>(repeated);
    if (absl::Status s = config.ok() ? Preflight(*config, {argv, argv + argc}) : absl::OkStatus();
        s.ok() && config.ok()) {
      s = CheckModelData(*config);
      if (s.ok()) s = CheckCheckpointBeforeLaunch(*config);
      if (s.ok()) s = ProfileStepsFor(*config).status();
      if (s.ok()) s = CheckPlantedFault();
      if (s.ok() && config->threads().borrow_idle_cores() && absl::GetFlag(FLAGS_bind_cores)) {
        s = absl::InvalidArgumentError(
            "threads.borrow_idle_cores lends a rank the cores of its idle peers, but the "
            "launcher's --bind_cores pins every rank to its own: drop one of them");
      }
      if (!s.ok()) config = absl::StatusOr<ExperimentConfig>(s);
    } else if (!s.ok()) {
      config = absl::StatusOr<ExperimentConfig>(s);
    }
    if (!config.ok()) {
      std::cerr << "error: " << config.status().message() << std::endl;
      std::exit(2);
    }
    ExportThreadConfig(config->threads());
    return WorldSizeOf(config->parallelism());
  });
  // Worker: memory tracking before anything is allocated; glog to the rank's
  // log file (opened once the run directory is known), warnings+ on stderr.
  if (absl::Status s = StartWorkerObservability(); !s.ok()) {
    std::cerr << "error: " << s << std::endl;
    return 1;
  }
  absl::StatusOr<ExperimentConfig> config = LoadResolvedConfig(default_config, WorldSizeFromEnv());
  if (!config.ok()) {
    std::cerr << "error: " << config.status().message() << std::endl;
    return 2;
  }
  absl::Status status = RunExperiment(*config);
  if (IsStoppedBySignal(status)) {
    LogErrorToRankLogOnly(status.ToString());
    StopRankLogging();
    std::cerr << status.message() << std::endl;
    return 128 + SIGTERM;
  }
  if (!status.ok()) {
    LogErrorToRankLogOnly(status.ToString());  // printed below
    StopRankLogging();
    std::cerr << "error: " << status << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace

int ExperimentMain(int argc, char** argv, const std::string& default_config) {
  return Main(argc, argv, default_config);
}

}  // namespace pp
