// main() of a training binary (train_gpt, train_bert, a researcher's own):
// load the config (file + flag overrides), validate it before any process
// group forms, launch pp x dp ranks through the launcher, and run each rank
// (run_experiment.h). The model is the one the config names among those
// linked into the binary (models/registry.h: link a model's registration).
// The run directory is run_report.h's.
//
//   int main(int argc, char** argv) {
//     return pp::ExperimentMain(argc, argv, "my_lab/configs/my_model.textproto");
//   }
//
// On a terminal rank 0 draws a progress bar (step/total, loss, tokens/s, ETA);
// otherwise it prints a plain log line every log_interval steps.
#ifndef DRIVER_EXPERIMENT_MAIN_H_
#define DRIVER_EXPERIMENT_MAIN_H_

#include <string>

namespace pp {

// `default_config`: the workspace-relative textproto used without --config
// (ship it as the binary's data). Returns the process exit code (2 for a bad
// config, 1 for a failed run).
int ExperimentMain(int argc, char** argv, const std::string& default_config);

}  // namespace pp

#endif  // DRIVER_EXPERIMENT_MAIN_H_
