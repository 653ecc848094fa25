// One rank's whole training run with a validated config: join the pp x dp
// grid, make the model's data and this rank's stage, train (checkpoints,
// evaluation, traces, non-finite guard), sample, and report (run_report.h).
#ifndef DRIVER_RUN_EXPERIMENT_H_
#define DRIVER_RUN_EXPERIMENT_H_

#include "absl/status/status.h"
#include "driver/experiment_config.h"

namespace pp {

// Call after the rendezvous environment is set (a launcher's worker). The
// config's model must be registered in this binary (models/registry.h).
absl::Status RunExperiment(const ExperimentConfig& config);

}  // namespace pp

#endif  // DRIVER_RUN_EXPERIMENT_H_
