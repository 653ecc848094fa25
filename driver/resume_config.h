// Resuming a run: what changed between the config a checkpoint was written
// with and this run's, and whether the continuation is still the same run.
#ifndef DRIVER_RESUME_CONFIG_H_
#define DRIVER_RESUME_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "driver/config_text.h"

namespace pp {

// Resume: compares the config a checkpoint was written with (`saved_text`,
// from its manifest) with this run's, field by field ("gpt.num_heads: 4 in
// the checkpoint, 8 now"). A difference that makes the continuation a
// different training run (the model and its fields, seed, optimizer.name)
// is an error listing every such field, unless
// checkpoint.allow_config_change is set; the other differences that change
// the numbers (learning rate and schedule, steps, batch and data, layout and
// schedule, which reshard) are appended to `warnings`. Fields that do not
// change the training (names, paths of outputs, logging, evaluation,
// sampling, checkpointing, timeouts) are ignored. A checkpoint without a
// config, or with one this build cannot parse, gives a warning.
absl::Status CheckResumeConfig(const std::string& saved_text, const ExperimentConfig& now,
                               std::vector<std::string>* warnings);

}  // namespace pp

#endif  // DRIVER_RESUME_CONFIG_H_
