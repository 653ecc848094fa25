// The tied autoencoder <-> a Hugging Face-style folder (config.json +
// model.safetensors), from this package only: the registration's `hf`
// section (models/registry.h, HfConversion) uses these, so an hf_convert
// linked with the registration (this package's :hf_convert) exports and
// imports the model. checkpoint/hf/hf_folder.h does the folder and the pipe
// checkpoint; this file knows the model's config.json and tensor names.
//
//   tied.code.weight                <-> encoder.weight  [kCode, kFeatures]
//                                       (the decoder reuses it, transposed)
//   layers.<i+1>.linear.weight/bias <-> blocks.<i>.linear.weight/bias
//
// config.json: model_type "tied_autoencoder", architectures
// ["TiedAutoencoder"], features, code, blocks. Thread-compatible.
#ifndef EXAMPLES_CUSTOM_MODEL_TIED_AUTOENCODER_HF_H_
#define EXAMPLES_CUSTOM_MODEL_TIED_AUTOENCODER_HF_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace custom_model {

inline constexpr char kHfModelType[] = "tied_autoencoder";

std::string TiedAutoencoderHfConfigJson(int64_t blocks);
// The blocks of a config.json; InvalidArgument naming a field this model
// cannot take (another model_type, features or code).
absl::StatusOr<int64_t> TiedAutoencoderBlocksFromHfJson(const std::string& json_text);

// A pipe checkpoint (a step directory or a root) of the model with `blocks`
// -> the folder `hf_dir` (created).
absl::Status ExportTiedAutoencoderCheckpoint(const std::string& checkpoint, int64_t blocks,
                                             const std::string& hf_dir);
// The folder -> step 0 of a pipe checkpoint under `root`; returns its blocks.
absl::StatusOr<int64_t> ImportTiedAutoencoderHf(const std::string& hf_dir, const std::string& root);

}  // namespace custom_model

#endif  // EXAMPLES_CUSTOM_MODEL_TIED_AUTOENCODER_HF_H_
