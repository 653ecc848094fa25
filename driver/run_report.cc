#include "driver/run_report.h"

#include <iostream>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "topology/blas_kernel.h"

namespace pp {

namespace fs = std::filesystem;

absl::Status WriteFile(const fs::path& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

absl::StatusOr<RunReport> RunReport::Open(const ExperimentConfig& config,
                                          const std::string& model_name, bool rank0) {
  RunReport report(config, model_name);
  if (!rank0) return report;
  const std::string base = absl::StrCat(
      config.name(), "-", absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::UTCTimeZone()));
  std::error_code ec;
  fs::create_directories(config.output_dir(), ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create output_dir ", config.output_dir(), ": ", ec.message()));
  }
  // mkdir is exclusive: two runs of one name started in the same second
  // shared a folder (interleaved metrics.jsonl, one config.textproto; issue
  // 29, finding 11). The later one takes the next free name.
  constexpr int kMaxSuffix = 1000;
  for (int i = 1; report.dir_.empty(); ++i) {
    const fs::path dir =
        fs::path(config.output_dir()) / (i == 1 ? base : absl::StrCat(base, "-", i));
    if (fs::create_directory(dir, ec)) {
      report.dir_ = dir;
    } else if (ec || i == kMaxSuffix) {
      return absl::InternalError(
          absl::StrCat("cannot create run directory ", dir.string(), ": ",
                       ec ? ec.message() : absl::StrCat(kMaxSuffix, " of that name exist")));
    }
  }
  PP_RETURN_IF_ERROR(WriteFile(report.dir_ / "config.textproto", ConfigToText(config)));
  report.metrics_ = std::make_unique<std::ofstream>(report.dir_ / "metrics.jsonl");
  return report;
}

void RunReport::Header(const std::string& data_description, int64_t tokens_per_step,
                       const PipelineModel& model) const {
  if (!active()) return;
  const auto& par = config_->parallelism();
  // The passes' form where the run asks for one (parallelism.vocab_barriers),
  // and whether their collectives run asynchronously.
  const std::string vocab =
      !par.vocab_parallel()
          ? ""
          : absl::StrCat(" (vocabulary parallel",
                         par.vocab_barriers() == 0 ? ""
                         : par.vocab_barriers() == 1
                             ? ", 1 barrier"
                             : absl::StrCat(", ", par.vocab_barriers(), " barriers"),
                         par.vocab_async_collectives() ? ", asynchronous collectives" : "", ")");
  const std::string tp =
      absl::StrCat(par.tp() > 1 ? absl::StrCat(" x tp=", par.tp()) : "",
                   par.distributed_optimizer() ? " (distributed optimizer)" : "", vocab);
  std::cout << absl::StrFormat(
                   "%s: %s, pp=%d x dp=%d%s, schedule %s, chunks %d, %d micro-batches of %d; "
                   "%s; %d tokens/step\n",
                   config_->name(), model_name_, par.pp(), par.dp(), tp, par.schedule(),
                   par.chunks(), par.num_microbatches(), par.micro_batch_size(), data_description,
                   tokens_per_step)
            << model.PartitionReport()
            // What the speed depends on (issue #43): a generic BLAS kernel is
            // several times slower than the CPU's own.
            << DescribeBlasKernel(ThisBlasKernel()) << "\n"
            << "run directory: " << dir_.string() << std::endl;
}

void RunReport::Restarted(int count, int max_restarts, const std::string& cause,
                          int64_t resumed_from_step) {
  if (!active()) return;
  restart_ = nlohmann::json{{"count", count},
                            {"max_restarts", max_restarts},
                            {"cause", cause},
                            {"resumed_from_step", resumed_from_step}}
                 .dump();
  std::cout << absl::StrFormat("restart %d/%d after %s; continuing at step %d\n", count,
                               max_restarts, cause, resumed_from_step)
            << std::flush;
}

absl::Status RunReport::Step(int64_t step, const StepResult& r, double tokens_per_s, double seconds,
                             std::optional<double> eval_loss, const StepMemory& memory,
                             Progress& progress) {
  if (!active()) return absl::OkStatus();
  nlohmann::json line = {{"step", step + 1},
                         {"loss", r.loss},
                         {"lr", r.learning_rate},
                         {"grad_norm", r.grad_norm},
                         {"tokens_per_s", tokens_per_s},
                         {"step_s", seconds}};
  if (eval_loss.has_value()) line["eval_loss"] = *eval_loss;
  // Per-token loss (packed or masked data): the labels the step trained.
  if (r.trained_tokens > 0) line["trained_tokens"] = r.trained_tokens;
  if (!restart_.empty()) {
    line["restart"] = nlohmann::json::parse(restart_);
    restart_.clear();
  }
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

absl::Status RunReport::Trace(int64_t step, bool first, const std::string& trace) const {
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

absl::Status RunReport::Sample(const std::string& text) const {
  if (!active()) return absl::OkStatus();
  PP_RETURN_IF_ERROR(WriteFile(dir_ / "sample.txt", text + "\n"));
  PP_RETURN_IF_ERROR(obs_->Text("sample", config_->steps(), text));
  std::cout << "sample (top-" << config_->sample_top_k() << ", " << config_->sample_tokens()
            << " bytes):\n"
            << text << "\n"
            << std::endl;
  return absl::OkStatus();
}

absl::Status RunReport::Finish(double train_seconds, const std::string& memory_summary) const {
  if (!active()) return absl::OkStatus();
  std::cout << memory_summary;
  const auto& par = config_->parallelism();
  PP_RETURN_IF_ERROR(WriteFile(
      dir_ / "loss.svg",
      LossCurveSvg(
          absl::StrCat(config_->name(), ": ", model_name_, " pp=", par.pp(), " dp=", par.dp(),
                       par.tp() > 1 ? absl::StrCat(" tp=", par.tp()) : "", " ", par.schedule()),
          train_curve_, eval_curve_)));
  if (train_curve_.empty()) return absl::OkStatus();
  std::cout << absl::StrFormat("done: %d steps in %s, loss %.4f -> %.4f%s\nrun directory: %s\n",
                               config_->steps(), FormatDuration(train_seconds),
                               train_curve_.front().second, train_curve_.back().second,
                               eval_curve_.empty()
                                   ? ""
                                   : absl::StrFormat(", eval loss %.4f", eval_curve_.back().second),
                               dir_.string())
            << std::flush;
  return absl::OkStatus();
}

}  // namespace pp
