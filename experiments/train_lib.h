// What train_gpt and train_bert run: load the config (file + flag overrides),
// validate it before any process group forms, launch pp x dp ranks, train,
// evaluate, and write the run directory:
//
//   <output_dir>/<name>-<UTC time>/
//     config.textproto   the resolved config (every field, defaults included)
//     metrics.jsonl      one line per step: step, loss, eval_loss, lr,
//                        grad_norm, tokens_per_s, step_s, bubble (per rank)
//     loss.svg           loss curve, written at the end
//     trace.json         Chrome trace of one step (chrome://tracing, Perfetto)
//     sample.txt         GPT: text generated through the pipeline at the end
//
// On a terminal rank 0 draws a progress bar (step/total, loss, tokens/s, ETA);
// otherwise it prints a plain log line every log_interval steps.
#ifndef EXPERIMENTS_TRAIN_LIB_H_
#define EXPERIMENTS_TRAIN_LIB_H_

#include "absl/status/status.h"
#include "experiments/experiment_config.h"

namespace pp {

// main() of an experiment binary: returns the process exit code (2 for a bad
// config, 1 for a failed run).
int ExperimentMain(int argc, char** argv, ModelKind kind);

// One rank's whole run with a validated config (after rendezvous env is set).
absl::Status RunExperiment(const ExperimentConfig& config, ModelKind kind);

}  // namespace pp

#endif  // EXPERIMENTS_TRAIN_LIB_H_
