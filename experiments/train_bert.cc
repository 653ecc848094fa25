// bazel run //experiments:train_bert -- [--config=experiments/configs/<name>.textproto] [overrides]
// Trains the reference BERT (masked LM) across pipeline stages; see docs/training.md.
#include "driver/experiment_main.h"

int main(int argc, char** argv) {
  return pp::ExperimentMain(argc, argv, "experiments/configs/bert_small_pp2.textproto");
}
