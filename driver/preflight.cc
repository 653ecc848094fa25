#include "driver/preflight.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <system_error>

#include <unistd.h>

#include <glog/logging.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "driver/memory_budget.h"
#include "models/data/corpus.h"
#include "models/registry.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/schedule/analysis/memory_plan.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

namespace fs = std::filesystem;
using driver::ExperimentConfig;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kFloat = 4;
// An Action in a schedule and its lowered program (sends, receives, tail):
// a generous per-compute-action cost, so a million-micro-batch schedule shows.
constexpr double kBytesPerAction = 256;

std::string GiB(double bytes) { return absl::StrFormat("%.1f GiB", bytes / kGiB); }

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

const char* FileKind(fs::file_type type) {
  switch (type) {
    case fs::file_type::fifo:
      return "a FIFO";
    case fs::file_type::socket:
      return "a socket";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::character:
      return "a character device";
    case fs::file_type::not_found:
      return "a dangling link";
    default:
      return "not a regular file";
  }
}

// NUL in the first 4 KB: the corpus loader skips such a file as binary.
bool LooksBinary(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char buffer[4096];
  in.read(buffer, sizeof(buffer));
  return std::find(buffer, buffer + in.gcount(), '\0') != buffer + in.gcount();
}

// Nothing but spaces, tabs and line ends (BERT finds no sentence in it; GPT
// would learn whitespace). Reads until the first other byte.
bool OnlyWhitespace(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char c;
  while (in.get(c)) {
    if (!std::isspace(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

std::string MemoryEstimate::ToString() const {
  return absl::StrFormat(
      "%s (%.3g parameters: %s weights, %s gradients, %s optimizer state, %s activations, %s "
      "schedule)",
      GiB(total_bytes()), parameters, GiB(parameter_bytes), GiB(gradient_bytes),
      GiB(optimizer_bytes), GiB(activation_bytes), GiB(schedule_bytes));
}

namespace {

// The sum over ranks of each rank's peak activation bytes under the config's
// schedule (memory_budget.h's PlannedSchedule: "auto" stands for its
// measurement schedule), every virtual stage holding `stage` per
// micro-batch; nullopt when the schedule is too big or does not build.
std::optional<double> SchedulePeakActivations(const ExperimentConfig& config,
                                              const StageMemory& stage) {
  absl::StatusOr<Schedule> schedule = PlannedSchedule(config);
  if (!schedule.ok() || schedule->forward_only) return std::nullopt;
  absl::StatusOr<MemoryPlan> plan =
      PlanMemory(*schedule, std::vector<StageMemory>(schedule->num_virtual_stages(), stage), {});
  if (!plan.ok()) return std::nullopt;
  double sum = 0;
  for (const RankMemoryPlan& rank : plan->ranks) sum += rank.peak_bytes;
  return sum;
}

}  // namespace

MemoryEstimate EstimateMemory(const ExperimentConfig& config) {
  MemoryEstimate e;
  const auto& par = config.parallelism();
  const double pp = std::max(1, par.pp()), dp = std::max(1, par.dp()), tp = std::max(1, par.tp());
  const double m = std::max(1, par.num_microbatches()), v = std::max(1, par.chunks());
  const double b = std::max(1, par.micro_batch_size());
  // Each rank holds its share of the schedule: ~2 actions per micro-batch and
  // chunk (forward, backward) plus their sends and receives.
  e.schedule_bytes = pp * dp * tp * (pp * v * m * 4) * kBytesPerAction;

  const std::optional<ModelMemory> model = ModelMemoryOf(config);
  if (!model.has_value()) return e;  // a model without its memory arithmetic: no estimate
  const double t = std::max<double>(1, model->context_length);
  const double w = std::max<double>(1, model->width);
  const double layers = std::max<double>(1, model->num_blocks);
  const double per_block = model->block_parameters(1);
  const double vocab = std::max<double>(1, model->vocab_size);
  // Token and position embeddings; the tied head is a second copy on the
  // last stage.
  const double embedding = (vocab + t) * w;
  e.parameters = layers * per_block + embedding + 2 * w;
  // Tensor parallelism splits the blocks' matrices and the vocabulary over the
  // model group; the rest (position embedding, final norm, and what of each
  // block its model keeps whole: tp ranks hold tp x block_parameters(tp) of
  // it in all) is on each of its tp ranks.
  const double held = e.parameters + (pp > 1 || !model->tied_embeddings ? vocab * w : 0) +
                      (tp - 1) * (t * w + 2 * w) +
                      layers * (tp * model->block_parameters(tp) - per_block);
  e.parameter_bytes = dp * held * kFloat;
  e.gradient_bytes = e.parameter_bytes;
  const std::string& opt = config.optimizer().name();
  const double moments = opt == "adamw" ? 2 : (config.optimizer().momentum() > 0 ? 1 : 0);
  e.optimizer_bytes = moments * e.parameter_bytes;

  // Activations kept for backward, per micro-batch and block (fp32).
  const double per_block_act =
      model->block_activation_bytes({.micro_batch_size = b, .value_bytes = kFloat});
  // Recomputation applies to the blocks checkpointable_types matches (none
  // matching: no recomputation at all; issue 29, finding 8).
  const int64_t interval = par.activation_checkpointing().interval();
  const double recomputed_layers =
      interval > 0 ? std::min(layers, CheckpointableLayerCount(config)) : 0;
  const double parts = pp * v;
  // One micro-batch's activations on one virtual stage (layers / parts of
  // them): kept from F to its backward, and with recomputation only each
  // range's input is kept and one range regenerated during the backward.
  StageMemory stage;
  const double plain_layers = (layers - recomputed_layers) / parts;
  stage.activation_bytes = plain_layers * per_block_act;
  if (recomputed_layers > 0) {
    const double stage_layers = recomputed_layers / parts;
    stage.activation_bytes +=
        std::ceil(stage_layers / static_cast<double>(interval)) * b * t * w * kFloat;
    stage.recompute_bytes = std::min<double>(interval, std::ceil(stage_layers)) * per_block_act;
  }
  // The micro-batches in flight come from the schedule itself (a registered
  // one or a CSV file): each rank's peak by liveness, as the simulator's
  // memory model walks its actions (pipeline/schedule/analysis/memory_plan.h). So
  // looped_bfs, which runs every forward of a chunk first, counts all of its
  // micro-batches, like GPipe, whatever it is called.
  const std::optional<double> peak = SchedulePeakActivations(config, stage);
  // Not buildable (too big to build here, or invalid: config validation
  // names why): every micro-batch of every chunk in flight on every rank.
  const double activations =
      peak.has_value() ? *peak : pp * v * m * (stage.activation_bytes) + pp * stage.recompute_bytes;
  // The logits (and their softmax) of a micro-batch on the last stage (split
  // by vocabulary under tensor parallelism).
  const double logits = 2 * b * t * vocab * kFloat;
  // Each tensor-parallel rank keeps the blocks' whole inputs and outputs and
  // its share of what is inside: at most tp times one rank's activations.
  e.activation_bytes = dp * (tp * activations + logits);
  return e;
}

// A "Key:   123 kB" line of /proc/meminfo in bytes.
int64_t MemInfoBytes(absl::string_view key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, key) || !absl::ConsumePrefix(&rest, ":")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, "kB");
    int64_t kib = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) return kib * 1024;
  }
  return -1;
}

int64_t AvailableMemoryBytes() { return MemInfoBytes("MemAvailable"); }
int64_t TotalMemoryBytes() { return MemInfoBytes("MemTotal"); }

absl::Status CheckMemory(const ExperimentConfig& config, int64_t available_bytes) {
  if (available_bytes < 0) available_bytes = AvailableMemoryBytes();
  if (available_bytes < 0) return absl::OkStatus();
  const MemoryEstimate e = EstimateMemory(config);
  if (e.total_bytes() <= static_cast<double>(available_bytes)) return absl::OkStatus();
  const auto& par = config.parallelism();
  return Invalid(absl::StrCat("the run needs an estimated ", e.ToString(), " for pp=", par.pp(),
                              " x dp=", par.dp(),
                              par.tp() > 1 ? absl::StrCat(" x tp=", par.tp()) : "",
                              " ranks, num_microbatches=", par.num_microbatches(),
                              ", micro_batch_size=", par.micro_batch_size(),
                              ", but this machine has ", GiB(static_cast<double>(available_bytes)),
                              available_bytes == TotalMemoryBytes() ? " in total" : " available",
                              " of memory (/proc/meminfo); use a smaller model (num_layers, width, "
                              "context_length), fewer or smaller micro-batches, or "
                              "parallelism.activation_checkpointing.interval"));
}

absl::Status CheckDataPath(const std::string& path, int64_t context_length, double eval_fraction) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    return Invalid(
        absl::StrCat("data.path '", path, "' does not exist; pass --data=<a text file or folder>"));
  }
  if (ec) {
    return Invalid(absl::StrCat("data.path '", path, "' cannot be read: ", ec.message()));
  }
  std::vector<fs::path> files;
  if (fs::is_regular_file(status)) {
    files.push_back(path);
  } else if (fs::is_directory(status)) {
    // Each folder once (models/data/corpus.h): a link to a parent would
    // otherwise be walked forever.
    absl::StatusOr<CorpusListing> listing = ListCorpusFiles(path);
    if (!listing.ok()) {
      return Invalid(absl::StrCat("data.path '", path,
                                  "': cannot list the folder: ", listing.status().message()));
    }
    if (listing->repeated_folders > 0) {
      LOG(WARNING) << "data.path '" << path << "': " << listing->repeated_folders
                   << " link(s) lead to a folder already read (a loop such as `ln -s . "
                      "sub`); each folder is read once";
    }
    files.assign(listing->files.begin(), listing->files.end());
  } else {
    return Invalid(absl::StrCat("data.path '", path, "' is ", FileKind(status.type()),
                                ", which a reader could wait on forever; pass a regular text "
                                "file or a folder of them"));
  }
  if (files.empty()) {
    return Invalid(absl::StrCat("data.path '", path,
                                "' is an empty folder (no regular files); pass a text file or a "
                                "folder of text files"));
  }
  double text_bytes = 0;
  size_t text_files = 0, blank_files = 0;
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      if (files.size() == 1) return Invalid(absl::StrCat("data.path '", path, "' cannot be read"));
      continue;
    }
    if (LooksBinary(file)) continue;
    const double size = static_cast<double>(fs::file_size(file, ec));
    if (ec || size == 0) continue;
    if (OnlyWhitespace(file)) {
      ++blank_files;
      continue;
    }
    text_bytes += size + 2;  // the loader ends each file with a blank line
    ++text_files;
  }
  if (text_files == 0 && blank_files > 0) {
    return Invalid(
        absl::StrCat("data.path '", path, "': its ", blank_files,
                     " text file(s) hold only whitespace (spaces, tabs, newlines); "
                     "there is nothing to learn or to sample sentences from. Pass text"));
  }
  if (text_files == 0) {
    return Invalid(absl::StrCat("data.path '", path, "': none of its ", files.size(),
                                " file(s) is non-empty text (a NUL byte in the first 4 KB marks a "
                                "file as binary); pass text files"));
  }
  const double train_bytes = text_bytes - std::floor(text_bytes * eval_fraction);
  if (context_length > 0 && train_bytes < static_cast<double>(context_length) + 1) {
    return Invalid(absl::StrCat("data.path '", path, "' holds ", train_bytes,
                                " bytes of training text (after data.eval_fraction ", eval_fraction,
                                "), shorter than context_length (", context_length,
                                ") + 1; pass more text or a shorter context_length"));
  }
  return absl::OkStatus();
}

namespace {

// Creates `dir` if needed and writes and removes a probe file in it; errors
// name `field` and end with `hint`.
absl::Status CheckWritableDir(const std::string& field, const std::string& dir,
                              const std::string& hint) {
  if (dir.empty()) return Invalid(absl::StrCat(field, " is empty; ", hint));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return Invalid(absl::StrCat(
        field, " '", dir, "' cannot be created",
        ec ? absl::StrCat(": ", ec.message()) : std::string(" (not a folder)"), "; ", hint));
  }
  const fs::path probe = fs::path(dir) / absl::StrCat(".preflight-", ::getpid());
  {
    std::ofstream out(probe);
    out << "probe";
    out.close();
    if (!out) {
      fs::remove(probe, ec);
      return Invalid(absl::StrCat(field, " '", dir, "' is not writable; ", hint));
    }
  }
  fs::remove(probe, ec);
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckOutputDir(const std::string& output_dir) {
  return CheckWritableDir("output_dir", output_dir, "pass --output_dir=<a writable folder>");
}

std::string CheckpointDirOf(const ExperimentConfig& config) {
  return config.checkpoint().dir().empty()
             ? (fs::path(config.output_dir()) / "checkpoints" / config.name()).string()
             : config.checkpoint().dir();
}

absl::Status CheckCheckpointDir(const ExperimentConfig& config) {
  if (config.checkpoint().save_interval() <= 0) return absl::OkStatus();
  return CheckWritableDir(
      config.checkpoint().dir().empty() ? "the checkpoint dir (<output_dir>/checkpoints/<name>)"
                                        : "checkpoint.dir",
      CheckpointDirOf(config),
      absl::StrCat("checkpoint.save_interval (", config.checkpoint().save_interval(),
                   ") saves there; set checkpoint.dir (--set=checkpoint.dir=<a writable folder>) "
                   "or save_interval=0"));
}

absl::Status CheckNoRepeatedFlags(const std::vector<std::string>& args) {
  std::map<std::string, std::vector<std::string>> seen;
  for (size_t i = 1; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    const std::string name(arg.substr(0, arg.find('=')));
    if (name.empty()) continue;
    std::vector<std::string>& uses = seen[name];
    uses.push_back(args[i]);
    if (uses.size() < 2) continue;
    std::string hint;
    if (name == "set") {
      std::vector<std::string> values;
      for (absl::string_view use : uses) {
        const size_t eq = use.find('=');
        if (eq != absl::string_view::npos) values.emplace_back(use.substr(eq + 1));
      }
      hint = absl::StrCat("; give one --set with comma-separated assignments: --set=",
                          absl::StrJoin(values, ","));
    }
    return Invalid(absl::StrCat("flag --", name, " is given ", uses.size(), " times (",
                                absl::StrJoin(uses, " "),
                                "); only the last would apply, so it is refused", hint));
  }
  return absl::OkStatus();
}

absl::Status Preflight(const ExperimentConfig& config, const std::vector<std::string>& args) {
  if (absl::Status s = CheckNoRepeatedFlags(args); !s.ok()) return s;
  if (absl::Status s = CheckMemory(config); !s.ok()) return s;
  if (const std::optional<ModelMemory> model = ModelMemoryOf(config);
      model.has_value() && config.data().source() == "corpus") {
    const int64_t context = model->context_length;
    if (absl::Status s =
            CheckDataPath(config.data().path(), context, config.data().eval_fraction());
        !s.ok()) {
      return s;
    }
  }
  PP_RETURN_IF_ERROR(CheckOutputDir(config.output_dir()));
  // An unwritable checkpoint dir was found at the first save (issue 29).
  return CheckCheckpointDir(config);
}

}  // namespace pp
