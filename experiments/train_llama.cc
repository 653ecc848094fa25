// bazel run //experiments:train_llama -- [--config=experiments/configs/<name>.textproto]
// [overrides] Trains the LLaMA-style decoder over token files across pipeline stages;
// tools/data/make_llama_data.sh makes llama_small_pp2's data. See
// docs/training.md.
#include "driver/experiment_main.h"

int main(int argc, char** argv) {
  return pp::ExperimentMain(argc, argv, "experiments/configs/llama_small_pp2.textproto");
}
