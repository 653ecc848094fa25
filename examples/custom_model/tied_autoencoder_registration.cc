// The tied autoencoder as a registered model (models/registry.h): linking this
// target lets pipe's driver train it from a config that names it, and an
// hf_convert (driver/hf_convert_main.h) export and import it
// (tied_autoencoder_hf.h).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/field_checks.h"
#include "examples/custom_model/tied_autoencoder.h"
#include "examples/custom_model/tied_autoencoder.pb.h"
#include "examples/custom_model/tied_autoencoder_hf.h"
#include "models/registry.h"

namespace custom_model {
namespace {

absl::StatusOr<pp::ModelData> Data(const TiedAutoencoderConfig&, const pp::ModelRun& run) {
  pp::ModelData data;
  data.train = std::make_unique<LowRankSource>(run.micro_batch_size, run.seed, 0);
  data.eval = std::make_unique<LowRankSource>(run.micro_batch_size, run.seed, 1);
  data.tokens_per_step = run.dp * run.num_microbatches * run.micro_batch_size;
  data.description = absl::StrCat("synthetic rank-", kCode, " data in ", kFeatures, " features");
  return data;
}

}  // namespace

PP_REGISTER_MODEL(
    TiedAutoencoderConfig, tied_autoencoder,
    {
        .name = "tied_autoencoder",
        .description = "autoencoder whose decoder reuses the encoder's weight",
        .data_sources = {},  // makes its own data
        .validate =
            [](const TiedAutoencoderConfig& c, const pp::ModelRun&) {
              return pp::CheckIntField("tied_autoencoder.blocks", c.blocks(), 0, 1000);
            },
        .specs = [](const TiedAutoencoderConfig& c) -> absl::StatusOr<std::vector<pp::LayerSpec>> {
          return TiedAutoencoderSpecs(static_cast<int>(c.blocks()));
        },
        .loss = ReconstructionLoss,
        // No .tensor_parallel_loss: the layers are dense, so the driver refuses
        // parallelism.tp > 1 for this model before launch. A model whose
        // factories build shards from LayerContext::model_parallel declares
        // support by setting it (docs/tensor_parallelism.md, GPT's registration).
        .data = Data,
        // Hugging Face-style folders: `hf_convert export` of a run's
        // checkpoint, `hf_convert import --model=tied_autoencoder` back
        // (the import's blocks come back as --set=tied_autoencoder.blocks=N).
        .hf = {.model_types = {kHfModelType},
               .import_folder = [](const std::string& hf_dir, const std::string& root)
                   -> absl::StatusOr<TiedAutoencoderConfig> {
                 absl::StatusOr<int64_t> blocks = ImportTiedAutoencoderHf(hf_dir, root);
                 if (!blocks.ok()) return blocks.status();
                 TiedAutoencoderConfig c;
                 c.set_blocks(*blocks);
                 return c;
               },
               .export_checkpoint =
                   [](const std::string& checkpoint, const TiedAutoencoderConfig& c,
                      const std::string& hf_dir) {
                     return ExportTiedAutoencoderCheckpoint(checkpoint, c.blocks(), hf_dir);
                   }},
    });

}  // namespace custom_model
