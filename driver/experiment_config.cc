#include "driver/experiment_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <regex>

#include <glog/logging.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/field_checks.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"
#include "driver/memory_budget.h"
#include "driver/preflight.h"
#include "models/registry.h"
#include "pipeline/auto_schedule/auto_options.h"
#include "pipeline/partition/partitioner.h"
#include "pipeline/runtime/mixed_precision.h"
#include "pipeline/runtime/optimizer.h"
#include "pipeline/runtime/stage_executor.h"
#include "pipeline/schedule/formats/csv.h"
#include "pipeline/schedule/ir/capabilities.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/ir/vocab_passes.h"
#include "pipeline/schedule/schedules/registry.h"
#include "topology/blas_kernel.h"
#include "topology/device.h"
#include "topology/host_staged_backend.h"
#include "topology/transport_thread.h"
#include "topology/worker_resources.h"

namespace pp {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// The run's name is a folder name inside output_dir (and checkpoints/<name>):
// '../../escape/x' wrote outside output_dir, and 300 characters plus the
// time stamp exceed a file name's 255 bytes (issue 29, findings 12 and
// "after workers start").
absl::Status CheckName(const std::string& name) {
  constexpr size_t kMaxName = 128;
  const auto allowed = [](char c) {
    return absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.';
  };
  bool ok =
      !name.empty() && name.size() <= kMaxName && (absl::ascii_isalnum(name[0]) || name[0] == '_');
  for (char c : name) ok = ok && allowed(c);
  if (ok) return absl::OkStatus();
  const std::string shown = name.size() > 60
                                ? absl::StrCat(absl::CEscape(name.substr(0, 60)), "...")
                                : absl::CEscape(name);
  return Invalid(absl::StrCat(
      "name '", shown, "' (", name.size(), " characters) is not a run name: valid are 1 to ",
      kMaxName,
      " letters, digits, '_', '-' and '.', starting with a letter, digit or '_' (it names the run "
      "directory inside output_dir, so no '/' and no leading '.'); choose the folder with "
      "--output_dir"));
}

// Every numeric field's range, before anything is built from them (a schedule
// of 1e9 micro-batches or 1e8 layer specs would exhaust memory first).
absl::Status CheckRanges(const ExperimentConfig& config) {
  const auto& par = config.parallelism();
  struct IntRange {
    const char* name;
    int64_t value, lo, hi;
    const char* why;
  };
  const IntRange ints[] = {
      {"parallelism.pp", par.pp(), 1, 1024, ""},
      {"parallelism.dp", par.dp(), 1, 1024, ""},
      {"parallelism.tp", par.tp(), 1, 64, "tensor-parallel ranks per stage share a node"},
      {"parallelism.chunks", par.chunks(), 1, 64, ""},
      {"parallelism.num_microbatches", par.num_microbatches(), 1, 65536,
       "every rank lists each micro-batch's actions"},
      {"parallelism.micro_batch_size", par.micro_batch_size(), 1, 1 << 20, ""},
      {"parallelism.timeout_seconds", par.timeout_seconds(), 1, 86400, "one day"},
      {"parallelism.ranks_per_device", par.ranks_per_device(), 1, 1024,
       "local ranks per GPU (1: a GPU per rank; above 1 only with device 'cuda')"},
      {"parallelism.transport_thread_nice", par.transport_thread_nice(), kMinTransportThreadNice,
       kMaxTransportThreadNice, "a nice value for Gloo's transport thread; 0 = the worker's own"},
      {"parallelism.activation_checkpointing.interval", par.activation_checkpointing().interval(),
       0, kUnbounded, ""},
      {"steps", config.steps(), 1, 1000000000000, ""},
      {"eval_batches", config.eval_batches(), 1, 1000000, ""},
      {"eval_interval", config.eval_interval(), 0, kUnbounded, ""},
      {"log_interval", config.log_interval(), 1, kUnbounded, ""},
      {"sample_tokens", config.sample_tokens(), 0, 1000000, ""},
      {"trace_step", config.trace_step(), 0, kUnbounded, ""},
      {"trace_steps", config.trace_steps(), 1, kUnbounded, ""},
      {"checkpoint.save_interval", config.checkpoint().save_interval(), 0, kUnbounded, ""},
      {"checkpoint.keep_last", config.checkpoint().keep_last(), 0, kUnbounded, ""},
      // 4 per core at most (topology/worker_resources.h): 4096 threads per
      // worker never reached a step.
      {"threads.intra_op", config.threads().intra_op(), 0, MaxWorkerThreads(),
       "0 = the launcher's choice; at most 4 per core of this machine"},
      {"threads.blas", config.threads().blas(), 0, MaxWorkerThreads(),
       "0 = the launcher's choice; at most 4 per core of this machine"},
      {"nonfinite.max_skipped_steps", config.nonfinite().max_skipped_steps(), 1, kUnbounded,
       "consecutive skipped steps before the run fails"},
  };
  if (config.nonfinite().policy() != "fail" && config.nonfinite().policy() != "skip") {
    return Invalid(absl::StrCat("nonfinite.policy '", config.nonfinite().policy(),
                                "' must be 'fail' or 'skip'"));
  }
  for (const IntRange& r : ints)
    PP_RETURN_IF_ERROR(CheckIntField(r.name, r.value, r.lo, r.hi, r.why));
  PP_RETURN_IF_ERROR(CheckName(config.name()));
  const auto& opt = config.optimizer();
  PP_RETURN_IF_ERROR(CheckRealField("optimizer.lr", opt.lr(), '(', 0, 10, ']'));
  PP_RETURN_IF_ERROR(CheckRealField("optimizer.weight_decay", opt.weight_decay(), '[', 0, 10, ']'));
  PP_RETURN_IF_ERROR(CheckRealField("optimizer.beta1", opt.beta1(), '[', 0, 1, ')'));
  PP_RETURN_IF_ERROR(CheckRealField("optimizer.beta2", opt.beta2(), '[', 0, 1, ')'));
  PP_RETURN_IF_ERROR(CheckRealField("optimizer.eps", opt.eps(), '(', 0, 1, ')'));
  PP_RETURN_IF_ERROR(CheckRealField("optimizer.momentum", opt.momentum(), '[', 0, 1, ')'));
  PP_RETURN_IF_ERROR(CheckRealField("optimizer.max_grad_norm", opt.max_grad_norm(), '[', 0,
                                    std::numeric_limits<double>::infinity(), ']',
                                    "0 = no clipping"));
  const auto& lr = config.lr_schedule();
  PP_RETURN_IF_ERROR(CheckIntField("lr_schedule.warmup_steps", lr.warmup_steps(), 0, kUnbounded));
  if (lr.name() == "warmup_cosine") {
    PP_RETURN_IF_ERROR(CheckRealField("lr_schedule.min_lr", lr.min_lr(), '[', 0, opt.lr(), ']',
                                      "at most optimizer.lr, the cosine's start"));
  } else {
    PP_RETURN_IF_ERROR(CheckRealField("lr_schedule.min_lr", lr.min_lr(), '[', 0,
                                      std::numeric_limits<double>::infinity(), ']'));
  }
  PP_RETURN_IF_ERROR(
      CheckRealField("data.eval_fraction", config.data().eval_fraction(), '[', 0, 0.5, ')'));
  PP_RETURN_IF_ERROR(
      CheckIntField("sample_top_k", config.sample_top_k(), 1, kUnbounded, "1 = greedy"));
  PP_RETURN_IF_ERROR(
      CheckRealField("sample_temperature", config.sample_temperature(), '(', 0, 100, ']'));
  return absl::OkStatus();
}

}  // namespace

int WorldSizeOf(const driver::ParallelismConfig& par) {
  const int64_t ranks = static_cast<int64_t>(par.pp()) * par.dp() * par.tp();
  CHECK_LE(ranks, kMaxWorldSize) << "validation bounds pp x dp x tp";
  return static_cast<int>(ranks);
}

ModelRun ModelRunOf(const ExperimentConfig& config) {
  const auto& par = config.parallelism();
  return ModelRun{.micro_batch_size = par.micro_batch_size(),
                  .num_microbatches = par.num_microbatches(),
                  .dp = par.dp(),
                  .pp = par.pp(),
                  .tp = par.tp(),
                  .sequence_parallel = par.sequence_parallel(),
                  .chunks = par.chunks(),
                  .seed = config.seed(),
                  .data_source = config.data().source(),
                  .data_path = config.data().path(),
                  .eval_fraction = config.data().eval_fraction(),
                  .data_format = config.data().format(),
                  .data_dtype = config.data().dtype(),
                  .document_aware = config.data().document_aware(),
                  .packing = config.data().packing(),
                  .packing_balance = config.data().packing_balance(),
                  .eos_token = config.data().eos_token(),
                  .packing_order = config.data().packing_order()};
}

absl::Status CheckModelData(const ExperimentConfig& config) {
  PP_ASSIGN_OR_RETURN(SelectedModel model, SelectModel(config.model()));
  if (!model.info->check_data) return absl::OkStatus();
  return model.info->check_data(*model.config, ModelRunOf(config));
}

absl::StatusOr<std::vector<LayerSpec>> MakeExperimentSpecs(const ExperimentConfig& config) {
  PP_ASSIGN_OR_RETURN(SelectedModel model, SelectModel(config.model()));
  if (!config.parallelism().vocab_parallel()) return model.info->specs(*model.config);
  if (!model.info->vocabulary_split) {
    return Invalid(absl::StrCat("model '", model.info->name,
                                "' has no vocabulary_split for parallelism.vocab_parallel"));
  }
  PP_ASSIGN_OR_RETURN(VocabularySplit split, model.info->vocabulary_split(*model.config));
  return split.body;
}

namespace {

// The model the config selects, and its own checks of its fields and of the
// run's shape (e.g. at least one block per model part).
absl::StatusOr<SelectedModel> CheckModel(const ExperimentConfig& config) {
  PP_ASSIGN_OR_RETURN(SelectedModel model, SelectModel(config.model()));
  if (model.info->validate)
    PP_RETURN_IF_ERROR(model.info->validate(*model.config, ModelRunOf(config)));
  return model;
}

// pp x dp x tp against the ranks the launcher started (0: not known yet).
absl::Status CheckWorldSize(const driver::ParallelismConfig& par, int world_size) {
  const int64_t ranks = static_cast<int64_t>(par.pp()) * par.dp() * par.tp();
  if (ranks > kMaxWorldSize) {
    return Invalid(absl::StrCat("parallelism.pp (", par.pp(), ") x parallelism.dp (", par.dp(),
                                ") x parallelism.tp (", par.tp(), ") = ", ranks, " ranks; at most ",
                                kMaxWorldSize, " are supported"));
  }
  if (world_size <= 0 || ranks == world_size) return absl::OkStatus();
  const std::string tp = par.tp() > 1 ? absl::StrCat(" x parallelism.tp (", par.tp(), ")") : "";
  return Invalid(absl::StrCat(
      "parallelism.pp (", par.pp(), ") x parallelism.dp (", par.dp(), ")", tp, " = ", ranks,
      " ranks, but ", world_size,
      " were started; leave --nproc_per_node unset (the launcher then starts pp x dp x tp ranks, "
      "split evenly over --nnodes) or set it to ",
      ranks, " / --nnodes"));
}

// The linked-in models for which `supports` holds, for a refusal's "use a
// model that does: ..." ("(none linked in)" when none).
std::string ModelsWhere(const std::function<bool(const ModelInfo&)>& supports) {
  std::vector<std::string> names;
  for (const ModelInfo* m : RegisteredModels()) {
    if (supports(*m)) names.push_back(m->name);
  }
  return names.empty() ? std::string("(none linked in)") : absl::StrJoin(names, ", ");
}

// Tensor parallelism: a model that supports it (its sizes are its own
// `validate`'s to check).
absl::Status CheckTensorParallel(const ExperimentConfig& config, const ModelInfo& model) {
  const auto& par = config.parallelism();
  if (par.sequence_parallel() && par.tp() <= 1) {
    return Invalid(absl::StrCat("parallelism.sequence_parallel needs parallelism.tp > 1 (it is ",
                                par.tp(),
                                "): it splits the sequence over the tensor-parallel ranks"));
  }
  if (par.tp() <= 1) return absl::OkStatus();
  if (!model.tensor_parallel_loss) {
    return Invalid(absl::StrCat(
        "parallelism.tp (", par.tp(), ") > 1, but model '", model.name,
        "' does not support tensor parallelism (its registration sets no tensor_parallel_loss; "
        "models/registry.h); use parallelism.tp 1, or a model that does: ",
        ModelsWhere([](const ModelInfo& m) { return bool(m.tensor_parallel_loss); })));
  }
  return absl::OkStatus();
}

// Vocabulary parallelism: a model that supports it, and none of what it
// cannot do yet (each refused by name).
absl::Status CheckVocabParallel(const ExperimentConfig& config, const ModelInfo& model) {
  const auto& par = config.parallelism();
  if (par.vocab_barriers() < 0 || par.vocab_barriers() > 2) {
    return Invalid(absl::StrCat("parallelism.vocab_barriers (", par.vocab_barriers(),
                                ") must be 1 (the one-barrier output algorithm) or 2 (two "
                                "barriers), or 0 (the default: pipe's choice)"));
  }
  if (par.vocab_barriers() != 0 && !par.vocab_parallel()) {
    return Invalid(absl::StrCat("parallelism.vocab_barriers (", par.vocab_barriers(),
                                ") is set without parallelism.vocab_parallel; set "
                                "vocab_parallel=true, or drop vocab_barriers"));
  }
  if (par.vocab_async_collectives() && !par.vocab_parallel()) {
    return Invalid(
        "parallelism.vocab_async_collectives (true) is set without parallelism.vocab_parallel "
        "(it runs the vocabulary passes' collectives asynchronously); set vocab_parallel=true, "
        "or drop vocab_async_collectives");
  }
  if (!par.vocab_parallel()) return absl::OkStatus();
  if (!model.vocabulary_split) {
    return Invalid(absl::StrCat(
        "parallelism.vocab_parallel is set, but model '", model.name,
        "' does not support vocabulary parallelism (its registration sets no vocabulary_split; "
        "models/registry.h); use a model that does: ",
        ModelsWhere([](const ModelInfo& m) { return bool(m.vocabulary_split); })));
  }
  // With tp > 1 the vocabulary is split over pipe x tensor, with or without
  // sequence parallelism; on a GPU the shards live on the rank's device
  // (docs/vocab_parallelism.md).
  return absl::OkStatus();
}

// The distributed optimizer's bucket: at least one parameter.
absl::Status CheckDistributedOptimizer(const driver::ParallelismConfig& par) {
  if (par.ddp_bucket_size() >= 1) return absl::OkStatus();
  return Invalid(absl::StrCat("parallelism.ddp_bucket_size (", par.ddp_bucket_size(),
                              ") must be >= 1 parameter per gradient bucket (default 40000000, "
                              "Megatron's)"));
}

// At least one layer per model part.
absl::Status CheckParts(const driver::ParallelismConfig& par, const std::vector<LayerSpec>& specs) {
  const int64_t parts = static_cast<int64_t>(par.pp()) * par.chunks();
  if (parts <= static_cast<int64_t>(specs.size())) return absl::OkStatus();
  return Invalid(absl::StrCat("parallelism.pp (", par.pp(), ") x parallelism.chunks (",
                              par.chunks(), ") = ", parts, " model parts, but the model has only ",
                              specs.size(), " layers; use at most ", specs.size(), " parts"));
}

// The schedule: registered, trains, accepts this shape, and the runtime can
// execute its lowered program (refused here, before any worker starts,
// rather than in every rank).
absl::Status CheckSchedule(const driver::ParallelismConfig& par) {
  if (!par.auto_costs().empty() && par.schedule() != kAutoSchedule) {
    return Invalid(absl::StrCat("parallelism.auto_costs ('", par.auto_costs(),
                                "') is for parallelism.schedule 'auto' (the schedule is '",
                                par.schedule(), "'); set the schedule to auto or drop the costs"));
  }
  if (par.schedule() == kAutoSchedule && !par.auto_costs().empty()) {
    absl::Status costs = AutoFixedCosts(par.auto_costs(), par.pp(), par.chunks()).status();
    if (!costs.ok()) return Invalid(std::string(costs.message()));
  }
  if (par.schedule() == kAutoSchedule) {
    // "auto" trains its first steps under the schedule it measures with.
    absl::StatusOr<std::string> start = AutoMeasurementSchedule(par.chunks());
    if (!start.ok()) return Invalid(std::string(start.status().message()));
    driver::ParallelismConfig measured = par;
    measured.set_schedule(*start);
    measured.clear_auto_costs();
    absl::Status status = CheckSchedule(measured);
    if (status.ok()) return status;
    return Invalid(absl::StrCat("parallelism.schedule 'auto' measures under '", *start,
                                "' first: ", status.message()));
  }
  const std::vector<std::string> names = RegisteredScheduleNames();
  // "csv:FILE" is a schedule file (pipeline/schedule/formats/csv.h); MakeSchedule reads it.
  if (!absl::StartsWith(par.schedule(), kCsvSchedulePrefix) &&
      std::find(names.begin(), names.end(), par.schedule()) == names.end()) {
    return Invalid(
        absl::StrCat("parallelism.schedule '", par.schedule(),
                     "' is not a registered schedule; valid: ", absl::StrJoin(names, ", "),
                     ", auto (synthesised from measured costs) or csv:FILE (a "
                     "schedule file)"));
  }
  ScheduleOptions so;
  so.num_stages = par.pp();
  so.num_microbatches = par.num_microbatches();
  so.num_chunks = par.chunks();
  absl::StatusOr<Schedule> schedule = MakeSchedule(par.schedule(), so);
  if (!schedule.ok()) {
    return Invalid(absl::StrCat("parallelism.schedule '", par.schedule(), "' rejects pp=", par.pp(),
                                ", num_microbatches=", par.num_microbatches(),
                                ", chunks=", par.chunks(), ": ", schedule.status().message()));
  }
  if (schedule->forward_only) {
    return Invalid(absl::StrCat("parallelism.schedule '", par.schedule(),
                                "' is forward-only (evaluation); choose a training schedule: ",
                                absl::StrJoin(names, ", ")));
  }
  // The driver gives the executor its vocabulary layers when the run splits
  // the vocabulary; the Trainer places the passes into a schedule without.
  RuntimeCapabilities capabilities = StageExecutorCapabilities();
  if (par.vocab_parallel()) {
    capabilities.vocab_parallel = true;
    if (schedule->vocab_parallel && par.vocab_barriers() != 0 &&
        schedule->vocab_barriers != par.vocab_barriers()) {
      return Invalid(absl::StrCat(
          "parallelism.schedule '", par.schedule(), "' has its own vocabulary passes with ",
          schedule->vocab_barriers, " barrier", schedule->vocab_barriers == 1 ? "" : "s",
          ", but parallelism.vocab_barriers is ", par.vocab_barriers(),
          "; drop vocab_barriers, or choose a schedule of that form (the \"_vocab1\" "
          "schedules have 1 barrier, \"_vocab\" 2, and any schedule without passes takes "
          "either)"));
    }
    if (!schedule->vocab_parallel) {
      absl::StatusOr<Schedule> with =
          AddVocabularyPasses(*schedule, PlacedVocabBarriers(par.vocab_barriers()));
      if (!with.ok()) {
        return Invalid(absl::StrCat("parallelism.schedule '", par.schedule(),
                                    "' takes no vocabulary passes (parallelism.vocab_parallel): ",
                                    with.status().message()));
      }
      schedule = std::move(with);
    }
  } else if (schedule->vocab_parallel) {
    return Invalid(absl::StrCat(
        "parallelism.schedule '", par.schedule(),
        "' has vocabulary passes; set parallelism.vocab_parallel=true (with a model that "
        "supports it) or choose a schedule without them"));
  }
  absl::StatusOr<LoweredProgram> program = Lower(*schedule);
  if (!program.ok()) {
    return Invalid(absl::StrCat("parallelism.schedule '", par.schedule(),
                                "' does not lower: ", program.status().message()));
  }
  absl::Status supported = CheckRuntimeSupports(*program, capabilities);
  if (!supported.ok()) {
    return Invalid(absl::StrCat("parallelism.schedule: ", supported.message()));
  }
  return absl::OkStatus();
}

// The device: known and present for every rank of this node.
absl::Status CheckDevice(const driver::ParallelismConfig& par) {
  absl::StatusOr<DeviceKind> device = ParseDeviceKind(par.device());
  if (!device.ok()) return Invalid(absl::StrCat("parallelism.device: ", device.status().message()));
  if (*device != DeviceKind::kCuda) {
    if (par.ranks_per_device() > 1) {
      return Invalid(absl::StrCat("parallelism.ranks_per_device = ", par.ranks_per_device(),
                                  " shares GPUs between ranks and needs parallelism.device 'cuda'; "
                                  "with device '",
                                  par.device(), "' leave it at 1"));
    }
    return absl::OkStatus();
  }
  const int local_ranks = WorldSizeOf(par);
  for (int local_rank : {0, local_ranks - 1}) {
    absl::StatusOr<c10::Device> cuda =
        DeviceForLocalRank(*device, local_rank, par.ranks_per_device());
    if (!cuda.ok()) {
      const std::string shared =
          par.ranks_per_device() == 1
              ? ""
              : absl::StrCat(", parallelism.ranks_per_device = ", par.ranks_per_device());
      return Invalid(absl::StrCat("parallelism.device 'cuda' (pp x dp", par.tp() > 1 ? " x tp" : "",
                                  " = ", local_ranks, " ranks on this node", shared,
                                  "): ", cuda.status().message()));
    }
  }
  if (par.ranks_per_device() > 1 && !HostStagedBackendAvailable()) {
    return Invalid(absl::StrCat("parallelism.ranks_per_device = ", par.ranks_per_device(),
                                " (ranks sharing a GPU) needs LibTorch 2.x; this binary's is ",
                                torch_compat::LibTorchVersion(), ": build with --config=cuda"));
  }
  return absl::OkStatus();
}

// The precision: fp32 or bf16 (fp16 refused saying why); bf16 only where
// this binary's LibTorch runs it on the run's device (a probe, before launch).
absl::Status CheckPrecision(const ExperimentConfig& config, bool probe_device) {
  absl::StatusOr<Precision> precision = ParsePrecision(config.precision());
  if (!precision.ok()) {
    return Invalid(absl::StrCat(precision.status().message(), " (precision, --precision)"));
  }
  if (*precision != Precision::kBf16 || !probe_device) return absl::OkStatus();
  absl::StatusOr<DeviceKind> kind = ParseDeviceKind(config.parallelism().device());
  if (!kind.ok()) return absl::OkStatus();  // CheckDevice names it
  absl::StatusOr<c10::Device> device = DeviceForLocalRank(*kind, 0);
  if (!device.ok()) return absl::OkStatus();  // CheckDevice names it
  return CheckBf16Support(*device);
}

// The partition method: registered, and it can cut this model (`profile`
// times the layers, so it is checked when the run has them).
absl::Status CheckPartition(const ExperimentConfig& config, const std::string& model_name,
                            const std::vector<LayerSpec>& specs) {
  const auto& par = config.parallelism();
  const std::string& method = par.partition_method();
  const std::string method_name = method.substr(0, method.find(':'));
  const std::vector<std::string> partitioners = RegisteredPartitioners();
  if (std::find(partitioners.begin(), partitioners.end(), method_name) == partitioners.end()) {
    return Invalid(absl::StrCat("parallelism.partition_method '", method,
                                "' is unknown; valid: ", absl::StrJoin(partitioners, ", "),
                                " (type:<regex> over layer types, explicit:<b0,b1,...>)"));
  }
  const int64_t parts = static_cast<int64_t>(par.pp()) * par.chunks();
  PartitionRequest request;
  request.specs = &specs;
  request.num_parts = parts;
  request.base_seed = config.seed();
  // `profile` times the layers inside the workers; here only its argument
  // is checked ('profile:garbage' failed after launch).
  request.check_only = method_name == "profile";
  absl::StatusOr<Bounds> bounds = Partition(method, request);
  if (bounds.ok()) return absl::OkStatus();
  return Invalid(absl::StrCat("parallelism.partition_method '", method, "' cannot cut the ",
                              model_name, " into ", parts, " parts: ", bounds.status().message()));
}

// The optimizer and the learning-rate schedule, as the runtime will build them.
absl::Status CheckOptimization(const ExperimentConfig& config) {
  PP_RETURN_IF_ERROR(ValidateOptimizerConfig(ToOptimizerConfig(config)));
  const LrScheduleConfig lr = ToLrScheduleConfig(config);
  if (absl::Status s = ValidateLrSchedule(lr); !s.ok()) {
    return Invalid(absl::StrCat("lr_schedule: ", s.message(),
                                " (lr_schedule.warmup_steps must be below steps; lower it with "
                                "--set=lr_schedule.warmup_steps=N or run more --steps)"));
  }
  return absl::OkStatus();
}

// data.packing and what it rules out: fixed p2p shapes (packed micro-batches
// vary in shape) and the windows' document_aware.
absl::Status CheckPacking(const ExperimentConfig& config) {
  const driver::DataConfig& data = config.data();
  if (data.packing() != "none" && data.packing() != "documents" && data.packing() != "padded") {
    return Invalid(absl::StrCat("data.packing '", data.packing(),
                                "' is unknown; valid: none, documents, padded"));
  }
  if (data.packing_balance() != "tokens" && data.packing_balance() != "cost") {
    return Invalid(absl::StrCat("data.packing_balance '", data.packing_balance(),
                                "' is unknown; valid: tokens, cost"));
  }
  if (data.packing_order() != "seed" && data.packing_order() != "cost") {
    return Invalid(absl::StrCat("data.packing_order '", data.packing_order(),
                                "' is unknown; valid: seed, cost"));
  }
  if (data.packing() == "none") return absl::OkStatus();
  if (data.source() == "synthetic") {
    return Invalid(absl::StrCat("data.packing '", data.packing(),
                                "' needs documents: data.source corpus or tokens, not synthetic"));
  }
  if (config.parallelism().p2p_static_shapes()) {
    return Invalid(absl::StrCat(
        "data.packing '", data.packing(),
        "' makes micro-batches of varying shapes, which parallelism.p2p_static_shapes cannot "
        "send (each channel keeps its first layout); set p2p_static_shapes: false "
        "(--p2p_static_shapes=false) or data.packing: none"));
  }
  if (data.document_aware()) {
    return Invalid(absl::StrCat("data.document_aware places windows; with data.packing '",
                                data.packing(),
                                "' there are no windows and documents never mix: drop one"));
  }
  if (data.eos_token() < 0) {
    return Invalid(absl::StrCat("data.eos_token (", data.eos_token(), ") must be a token id >= 0"));
  }
  return absl::OkStatus();
}

// The data source the model reads and its path, the held-out fraction, and
// sampling (for a model with a sampler).
absl::Status CheckDataAndSampling(const ExperimentConfig& config, const ModelInfo& model) {
  const std::string& source = config.data().source();
  if (source != "corpus" && source != "synthetic" && source != "tokens") {
    return Invalid(
        absl::StrCat("data.source '", source, "' is unknown; valid: corpus, synthetic, tokens"));
  }
  if (source == "tokens" && config.data().format() != "flat" &&
      config.data().format() != "megatron") {
    return Invalid(absl::StrCat("data.format '", config.data().format(),
                                "' is unknown; valid: flat, megatron"));
  }
  if (source == "tokens" && config.data().dtype() != "uint16" &&
      config.data().dtype() != "uint32") {
    return Invalid(absl::StrCat("data.dtype '", config.data().dtype(),
                                "' is unknown; valid: uint16, uint32 (flat files)"));
  }
  const std::vector<std::string>& sources = model.data_sources;
  if (!sources.empty() && std::find(sources.begin(), sources.end(), source) == sources.end()) {
    return Invalid(absl::StrCat("data.source '", source, "' is not one that model '", model.name,
                                "' reads; valid here: ", absl::StrJoin(sources, ", ")));
  }
  std::error_code ec;
  if (!sources.empty() && source == "corpus" &&
      !std::filesystem::exists(config.data().path(), ec)) {
    return Invalid(absl::StrCat("data.path '", config.data().path(),
                                "' does not exist; pass --data=<a text file or folder>"));
  }
  PP_RETURN_IF_ERROR(CheckPacking(config));
  if (!(config.data().eval_fraction() >= 0 && config.data().eval_fraction() < 0.5)) {
    return Invalid(absl::StrCat("data.eval_fraction (", config.data().eval_fraction(),
                                ") must be in [0, 0.5)"));
  }
  if (model.sampler && config.sample_top_k() < 1) {
    return Invalid(
        absl::StrCat("sample_top_k (", config.sample_top_k(), ") must be at least 1 (1 = greedy)"));
  }
  if (model.sampler && !(config.sample_temperature() > 0)) {
    return Invalid(
        absl::StrCat("sample_temperature (", config.sample_temperature(), ") must be positive"));
  }
  // The sampler starts from the prompt's tokens; an empty one failed only
  // after the whole training.
  if (model.sampler && config.sample_tokens() > 0 && config.sample_prompt().empty()) {
    return Invalid(absl::StrCat("sample_prompt is empty, but sample_tokens (",
                                config.sample_tokens(),
                                ") asks for text sampled from it; give a prompt of at least one "
                                "character (--set=sample_prompt=...) or sample_tokens=0"));
  }
  return absl::OkStatus();
}

// checkpoint.resume: "", "auto", or a checkpoint (or a root with `latest`)
// that exists; a missing one failed in every worker after launch.
absl::Status CheckResumePath(const driver::CheckpointConfig& checkpoint) {
  const std::string& resume = checkpoint.resume();
  if (resume.empty() || resume == "auto") return absl::OkStatus();
  std::error_code ec;
  if (std::filesystem::is_directory(resume, ec)) return absl::OkStatus();
  return Invalid(absl::StrCat(
      "checkpoint.resume '", resume, "' ",
      std::filesystem::exists(resume, ec) ? "is not a directory" : "does not exist",
      "; valid: a checkpoint directory (step_N), a checkpoint dir holding 'latest', 'auto' "
      "(continue from checkpoint.dir's latest, if any) or empty (start fresh)"));
}

// Activation checkpointing recomputes only layers whose type name matches
// checkpointable_types: a regex that does not compile failed in the
// workers, and one that matches no layer silently turned recomputation off
// (peak 305 instead of 37 MiB; issue 29, finding 13).
absl::Status CheckCheckpointableTypes(const driver::ParallelismConfig& par,
                                      const std::vector<LayerSpec>& specs) {
  const auto& ac = par.activation_checkpointing();
  if (ac.interval() == 0 || ac.checkpointable_types().empty()) return absl::OkStatus();
  std::vector<std::string> types;
  for (const LayerSpec& spec : specs) {
    if (std::find(types.begin(), types.end(), spec.name()) == types.end())
      types.push_back(spec.name());
  }
  const std::string field =
      absl::StrCat("parallelism.activation_checkpointing.checkpointable_types '",
                   ac.checkpointable_types(), "'");
  std::regex re;
  try {
    re = std::regex(ac.checkpointable_types(), std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Invalid(absl::StrCat(
        field, " does not compile as an ECMAScript regex (", e.what(),
        "); it must match whole layer type names, this model's: ", absl::StrJoin(types, ", ")));
  }
  for (const std::string& type : types) {
    if (std::regex_match(type, re)) return absl::OkStatus();
  }
  return Invalid(absl::StrCat(
      field, " matches none of this model's layer types (", absl::StrJoin(types, ", "),
      "), so activation checkpointing (interval ", ac.interval(),
      ") would recompute nothing; name one of them (whole name, case-sensitive), leave it empty "
      "for every layer with parameters, or set interval 0"));
}

// threads.borrow_idle_cores: CPU ranks on OpenBLAS, whose threads split a
// matrix product without changing its bits (pipeline/runtime/idle_core_threads.h).
absl::Status CheckIdleCores(const ExperimentConfig& config) {
  if (!config.threads().borrow_idle_cores()) return absl::OkStatus();
  if (config.parallelism().device() != "cpu") {
    return Invalid(
        absl::StrCat("threads.borrow_idle_cores lends CPU cores to BLAS threads; "
                     "parallelism.device is '",
                     config.parallelism().device(), "' (use cpu, or leave it off)"));
  }
  const BlasKernel blas = ThisBlasKernel();
  if (!blas.openblas) {
    return Invalid(absl::StrCat(
        "threads.borrow_idle_cores needs OpenBLAS, whose threads give every matrix product the "
        "same bits; this LibTorch computes with ",
        blas.blas, " (leave it off)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateExperimentConfig(const ExperimentConfig& config, int world_size) {
  PP_RETURN_IF_ERROR(CheckRanges(config));
  PP_ASSIGN_OR_RETURN(const SelectedModel model, CheckModel(config));
  PP_RETURN_IF_ERROR(CheckWorldSize(config.parallelism(), world_size));
  // Before the schedule's action lists and the layer specs are built.
  PP_RETURN_IF_ERROR(CheckMemory(config, world_size > 0 ? TotalMemoryBytes() : -1));
  PP_RETURN_IF_ERROR(CheckTensorParallel(config, *model.info));
  PP_RETURN_IF_ERROR(CheckDistributedOptimizer(config.parallelism()));
  PP_RETURN_IF_ERROR(CheckVocabParallel(config, *model.info));
  PP_ASSIGN_OR_RETURN(const std::vector<LayerSpec> specs, MakeExperimentSpecs(config));
  PP_RETURN_IF_ERROR(CheckParts(config.parallelism(), specs));
  PP_RETURN_IF_ERROR(CheckCheckpointableTypes(config.parallelism(), specs));
  PP_RETURN_IF_ERROR(CheckSchedule(config.parallelism()));
  PP_RETURN_IF_ERROR(CheckIdleCores(config));
  PP_RETURN_IF_ERROR(CheckDevice(config.parallelism()));
  PP_RETURN_IF_ERROR(CheckPrecision(config, /*probe_device=*/world_size > 0));
  // After the schedule and precision are known good: the per-rank cap.
  PP_RETURN_IF_ERROR(CheckMemoryCap(config));
  PP_RETURN_IF_ERROR(CheckPartition(config, model.info->name, specs));
  PP_RETURN_IF_ERROR(CheckOptimization(config));
  PP_RETURN_IF_ERROR(CheckResumePath(config.checkpoint()));
  return CheckDataAndSampling(config, *model.info);
}

OptimizerConfig ToOptimizerConfig(const ExperimentConfig& config) {
  OptimizerConfig opt;
  opt.name = config.optimizer().name();
  opt.lr = config.optimizer().lr();
  opt.weight_decay = config.optimizer().weight_decay();
  opt.momentum = config.optimizer().momentum();
  opt.beta1 = config.optimizer().beta1();
  opt.beta2 = config.optimizer().beta2();
  opt.eps = config.optimizer().eps();
  return opt;
}

LrScheduleConfig ToLrScheduleConfig(const ExperimentConfig& config) {
  LrScheduleConfig lr;
  lr.name = config.lr_schedule().name();
  lr.warmup_steps = config.lr_schedule().warmup_steps();
  lr.total_steps = config.steps();
  lr.min_lr = config.lr_schedule().min_lr();
  return lr;
}

}  // namespace pp
