// bazel run //experiments:train_gpt -- [--config=experiments/configs/<name>.textproto] [overrides]
// Trains the reference GPT across pipeline stages; see docs/training.md.
#include "driver/experiment_main.h"

int main(int argc, char** argv) {
  return pp::ExperimentMain(argc, argv, "experiments/configs/gpt_small_pp2.textproto");
}
