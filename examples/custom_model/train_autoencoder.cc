// bazel run //examples/custom_model:train_autoencoder -- [--pp=2 --steps=100 ...]
// The tied autoencoder trained by pipe's driver: same launcher, flags, config
// validation, Trainer, checkpoints and run directory as train_gpt. The model
// is this package's registration (tied_autoencoder_registration.cc); the
// config (autoencoder_pp2.textproto) names it and carries its fields.
#include "driver/experiment_main.h"

int main(int argc, char** argv) {
  return pp::ExperimentMain(argc, argv, "examples/custom_model/autoencoder_pp2.textproto");
}
