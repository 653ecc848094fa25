// Checks made before any worker starts, so that a run that cannot work exits 2
// naming the reason instead of failing (or hanging) inside the workers:
//
//   - memory: parameters, gradients, optimizer state, activations and the
//     schedule's action lists of every rank, estimated from the config and
//     compared with the machine's MemAvailable (/proc/meminfo);
//   - data.path: a regular file or a directory, never a FIFO or device (a
//     reader would block forever); some text (not binary, not empty), and at
//     least context_length + 1 bytes of training text;
//   - output_dir, and the checkpoint dir of a run that saves: creatable and
//     writable (a probe file is written and removed);
//   - the command line: a flag given twice (absl keeps only the last value,
//     so `--set=a=1 --set=b=2` would silently drop a=1).
//
//   PP_RETURN_IF_ERROR(pp::Preflight(config, {argv, argv + argc}));
//
// ExperimentConfig validation (experiment_config.h) calls CheckMemory itself,
// before it builds the schedule or the layer specs. Every error is
// InvalidArgument naming the field or path and what would be valid.
#ifndef DRIVER_PREFLIGHT_H_
#define DRIVER_PREFLIGHT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "driver/config.pb.h"

namespace pp {

// Bytes a whole run needs on this machine (every rank of pp x dp; assumes all
// ranks share the machine). An estimate: fp32, the transformer's matrices and
// embeddings, and the activations each rank holds at its peak under the
// config's own schedule (registered or CSV: pipeline/schedule/analysis/memory_plan.h
// walks its actions, so GPipe and looped_bfs keep all m micro-batches, 1F1B
// p - r), fewer with activation checkpointing on the layers its
// checkpointable_types matches (none matching: no recomputation).
struct MemoryEstimate {
  double parameters = 0;        // of the whole model
  double parameter_bytes = 0;   // x dp replicas
  double gradient_bytes = 0;    // x dp
  double optimizer_bytes = 0;   // AdamW: 2 moments; SGD: momentum buffer if momentum > 0
  double activation_bytes = 0;  // every stage, every replica
  double schedule_bytes = 0;    // per-rank action lists and lowered programs
  double total_bytes() const {
    return parameter_bytes + gradient_bytes + optimizer_bytes + activation_bytes + schedule_bytes;
  }
  // "5.1 GiB (1.2e+08 parameters: 0.5 GiB weights, ...)"
  std::string ToString() const;
};

// REQUIRES: defaults resolved (ResolveDefaults). A model without a
// transformer shape (models/registry.h) counts only the schedule.
MemoryEstimate EstimateMemory(const driver::ExperimentConfig& config);

// MemAvailable / MemTotal from /proc/meminfo in bytes; -1 when unreadable.
int64_t AvailableMemoryBytes();
int64_t TotalMemoryBytes();

// InvalidArgument naming the estimate when it exceeds `available_bytes`
// (-1: MemAvailable; unknown memory passes). Workers, which start together
// and allocate at once, pass TotalMemoryBytes(): MemAvailable would count
// their siblings' models against them.
absl::Status CheckMemory(const driver::ExperimentConfig& config, int64_t available_bytes = -1);

// data.path as train_gpt / train_bert read it (models/data/corpus.h).
// `context_length`: the model's; 0 skips the length check.
absl::Status CheckDataPath(const std::string& path, int64_t context_length, double eval_fraction);

// Creates `output_dir` if needed and writes and removes a probe file in it.
absl::Status CheckOutputDir(const std::string& output_dir);

// Where the run's checkpoints go: checkpoint.dir, or by default
// <output_dir>/checkpoints/<name> (REQUIRES: paths resolved from the workspace).
std::string CheckpointDirOf(const driver::ExperimentConfig& config);

// When the run saves (checkpoint.save_interval > 0): its checkpoint dir is
// created if needed and written to as CheckOutputDir does.
absl::Status CheckCheckpointDir(const driver::ExperimentConfig& config);

// `args`: argv (args[0] the program). A flag named twice, in any of the
// forms --f=v, -f=v, --f v, is refused, naming both and how to merge them.
absl::Status CheckNoRepeatedFlags(const std::vector<std::string>& args);

// All of the above that apply: the command line, memory, output_dir, the
// checkpoint dir, and for a transformer model reading a corpus its data.path.
absl::Status Preflight(const driver::ExperimentConfig& config,
                       const std::vector<std::string>& args);

}  // namespace pp

#endif  // DRIVER_PREFLIGHT_H_
