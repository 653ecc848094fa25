// bazel run //examples/custom_model:train_autoencoder -- [--pp=2 --steps=100 ...]
// The tied autoencoder trained by pipe's experiment driver: same launcher,
// flags, config validation, Trainer, checkpoints and run directory as
// train_gpt. The config (autoencoder_pp2.textproto) has no model section; the
// model reads micro_batch_size and seed from it.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "driver/experiment_main.h"
#include "driver/experiment_model.h"
#include "examples/custom_model/tied_autoencoder.h"

int main(int argc, char** argv) {
  pp::ExperimentModel model;
  model.name = "tied_autoencoder";
  model.default_config = "examples/custom_model/autoencoder_pp2.textproto";
  model.specs = [](const pp::ExperimentConfig&) -> absl::StatusOr<std::vector<pp::LayerSpec>> {
    return custom_model::TiedAutoencoderSpecs(/*blocks=*/2);
  };
  model.loss = custom_model::ReconstructionLoss;
  model.data = [](const pp::ExperimentConfig& config) -> absl::StatusOr<pp::ExperimentData> {
    const auto& par = config.parallelism();
    pp::ExperimentData data;
    data.train =
        std::make_unique<custom_model::LowRankSource>(par.micro_batch_size(), config.seed(), 0);
    data.eval =
        std::make_unique<custom_model::LowRankSource>(par.micro_batch_size(), config.seed(), 1);
    data.tokens_per_step = int64_t{par.dp()} * par.num_microbatches() * par.micro_batch_size();
    data.description = absl::StrCat("synthetic rank-", custom_model::kCode, " data in ",
                                    custom_model::kFeatures, " features");
    return data;
  };
  return pp::ExperimentMain(argc, argv, model);
}
