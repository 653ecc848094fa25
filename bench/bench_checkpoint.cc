// bench_checkpoint: save and load throughput of pipe's layer-wise checkpoints
// (model + AdamW state) for a GPT, against the raw write bandwidth of the same
// disk measured in the same run (one file of the same total size, write() +
// fsync) and the raw read bandwidth (page cache warm, as for the load).
//
//   bazel run //bench:bench_checkpoint -- --dir=/tmp/bench_ckpt
//
// Default model: GPT-2 small (12 layers, width 768, vocab 50257, context 1024,
// ~124M parameters). Prints a table and one JSON line.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "bench/bench_common.h"
#include "checkpoint/model/model_checkpoint.h"
#include "models/gpt/gpt.h"
#include "nlohmann/json.hpp"
#include "pipeline/pipeline_model.h"

ABSL_FLAG(std::string, dir, "/tmp/pipe_bench_checkpoint",
          "where checkpoints and the raw file are written (removed after)");
ABSL_FLAG(int, layers, 12, "GPT transformer blocks");
ABSL_FLAG(int, width, 768, "GPT width");
ABSL_FLAG(int, heads, 12, "GPT attention heads");
ABSL_FLAG(int, vocab, 50257, "GPT vocabulary");
ABSL_FLAG(int, context, 1024, "GPT context length");
ABSL_FLAG(int, repeats, 3, "repetitions; the median is reported");
ABSL_FLAG(bool, optimizer, true, "include AdamW state (2 tensors per parameter)");

namespace pp {
namespace {

namespace fs = std::filesystem;
using Clock = BenchClock;
// Writes `bytes` with write() in 64 MiB chunks, then fsync: the disk's raw
// sequential write bandwidth as a checkpoint sees it.
double RawWrite(const std::string& path, int64_t bytes) {
  std::vector<char> chunk(64 << 20, 'x');
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  for (int64_t done = 0; done < bytes;) {
    ssize_t n = ::write(fd, chunk.data(),
                        static_cast<size_t>(std::min<int64_t>(chunk.size(), bytes - done)));
    if (n <= 0) break;
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
  return Seconds(t0, Clock::now());
}

double RawRead(const std::string& path) {
  std::vector<char> chunk(64 << 20);
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  while (::read(fd, chunk.data(), chunk.size()) > 0) {
  }
  ::close(fd);
  return Seconds(t0, Clock::now());
}

// The table (checkpoint save and load against the raw disk) and the JSON line.
void Report(const GptModelConfig& config, int64_t params, int files, int64_t bytes, int repeats,
            const std::string& dir, const std::vector<double>& save_s,
            const std::vector<double>& load_s, const std::vector<double>& raw_write_s,
            const std::vector<double>& raw_read_s) {
  const double mb = static_cast<double>(bytes) / 1e6;
  const double save = mb / Median(save_s), load = mb / Median(load_s);
  const double raw_w = mb / Median(raw_write_s), raw_r = mb / Median(raw_read_s);
  std::printf(
      "bench_checkpoint: GPT %lld layers, width %lld, vocab %lld, context %lld: %.1fM "
      "parameters%s\n",
      static_cast<long long>(config.num_layers()), static_cast<long long>(config.width()),
      static_cast<long long>(config.vocab_size()), static_cast<long long>(config.context_length()),
      params / 1e6, absl::GetFlag(FLAGS_optimizer) ? " + AdamW state" : "");
  std::printf("checkpoint: %d files, %.1f MB, median of %d runs, dir %s\n", files, mb, repeats,
              dir.c_str());
  std::printf("%-28s %10s %10s %10s\n", "operation", "seconds", "MB/s", "vs raw");
  std::printf("%-28s %10.3f %10.0f %10s\n", "raw write + fsync (1 file)", Median(raw_write_s),
              raw_w, "1.00");
  std::printf("%-28s %10.3f %10.0f %10.2f\n", "checkpoint save", Median(save_s), save,
              save / raw_w);
  std::printf("%-28s %10.3f %10.0f %10s\n", "raw read (page cache)", Median(raw_read_s), raw_r,
              "1.00");
  std::printf("%-28s %10.3f %10.0f %10.2f\n", "checkpoint load", Median(load_s), load,
              load / raw_r);
  nlohmann::json j = {{"bench", "checkpoint"},
                      {"params", params},
                      {"files", files},
                      {"bytes", bytes},
                      {"save_mb_s", save},
                      {"load_mb_s", load},
                      {"raw_write_mb_s", raw_w},
                      {"raw_read_mb_s", raw_r},
                      {"save_vs_raw", save / raw_w},
                      {"load_vs_raw", load / raw_r},
                      {"repeats", repeats}};
  std::printf("%s\n", j.dump().c_str());
}

int Main() {
  SetBenchThreads(1);
  GptModelConfig config;
  config.set_num_layers(absl::GetFlag(FLAGS_layers));
  config.set_width(absl::GetFlag(FLAGS_width));
  config.set_num_heads(absl::GetFlag(FLAGS_heads));
  config.set_vocab_size(absl::GetFlag(FLAGS_vocab));
  config.set_context_length(absl::GetFlag(FLAGS_context));
  auto specs = MakeGptSpecs(config);
  if (!specs.ok()) {
    std::fprintf(stderr, "%s\n", specs.status().ToString().c_str());
    return 2;
  }
  auto model = BuildSequential(*specs, 1234);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 2;
  }
  ModelState state = ModelStateOfModule(**model, static_cast<int64_t>(specs->size()));
  int64_t params = 0;
  for (const auto& p : (*model)->parameters()) params += p.numel();
  torch::optim::AdamW optimizer((*model)->parameters(), torch::optim::AdamWOptions(1e-4));
  if (absl::GetFlag(FLAGS_optimizer)) {
    for (auto& p : (*model)->parameters()) p.mutable_grad() = torch::zeros_like(p);
    optimizer.step();  // allocates exp_avg / exp_avg_sq
  }

  const std::string dir = absl::GetFlag(FLAGS_dir);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::vector<double> save_s, load_s, raw_write_s, raw_read_s;
  int64_t bytes = 0;
  int files = 0;
  for (int r = 0; r < repeats; ++r) {
    SaveRequest request;
    request.root = dir + "/ckpt";
    request.step = r;
    request.keep_last = 1;
    request.model = &state;
    request.optimizer = &optimizer;
    auto t0 = Clock::now();
    auto saved = SaveCheckpoint(request, CheckpointRank());
    save_s.push_back(Seconds(t0, Clock::now()));
    if (!saved.ok()) {
      std::fprintf(stderr, "save: %s\n", saved.status().ToString().c_str());
      return 1;
    }
    auto manifest = ReadManifest(*saved);
    bytes = 0;
    files = manifest->files_size();
    for (const auto& f : manifest->files()) bytes += f.size_bytes();

    t0 = Clock::now();
    auto report = LoadCheckpoint(*saved, state, &optimizer, CheckpointRank());
    load_s.push_back(Seconds(t0, Clock::now()));
    if (!report.ok()) {
      std::fprintf(stderr, "load: %s\n", report.status().ToString().c_str());
      return 1;
    }
    const std::string raw = dir + "/raw.bin";
    raw_write_s.push_back(RawWrite(raw, bytes));
    raw_read_s.push_back(RawRead(raw));
    fs::remove(raw);
  }
  fs::remove_all(dir);

  Report(config, params, files, bytes, repeats, dir, save_s, load_s, raw_write_s, raw_read_s);
  return 0;
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pp::Main();
}
