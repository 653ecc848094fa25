// main() of a training binary (train_gpt, train_bert, a user's trainer): load
// the config (file + flag overrides), validate it before any process group
// forms, launch pp x dp ranks through the launcher, and run each rank
// (run_experiment.h). The run directory is run_report.h's.
//
// On a terminal rank 0 draws a progress bar (step/total, loss, tokens/s, ETA);
// otherwise it prints a plain log line every log_interval steps.
#ifndef DRIVER_EXPERIMENT_MAIN_H_
#define DRIVER_EXPERIMENT_MAIN_H_

#include "driver/experiment_config.h"
#include "driver/experiment_model.h"

namespace pp {

// Returns the process exit code (2 for a bad config, 1 for a failed run).
int ExperimentMain(int argc, char** argv, ModelKind kind);
// The same for a user's model (ModelKind::kCustom).
int ExperimentMain(int argc, char** argv, const ExperimentModel& model);

}  // namespace pp

#endif  // DRIVER_EXPERIMENT_MAIN_H_
