#include "driver/hf_convert_main.h"

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/hf/hf_json.h"
#include "checkpoint/model/checkpoint_dir.h"
#include "common/regular_file.h"
#include "common/status_macros.h"
#include "driver/experiment_config.h"
#include "google/protobuf/text_format.h"
#include "models/registry.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "",
          "import: a registered model's name or a Hugging Face model_type its registration "
          "declares (e.g. llama, gpt2); empty: the folder's config.json model_type");
ABSL_FLAG(std::string, hf_dir, "", "the Hugging Face folder (read by import, written by export)");
ABSL_FLAG(std::string, checkpoint, "",
          "import: the pipe checkpoint root to write; export: the checkpoint to read");

namespace pp {
namespace {

absl::Status Usage(const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat(what,
                   "; usage: hf_convert import [--model=MODEL] --hf_dir=DIR --checkpoint=ROOT, or "
                   "hf_convert export --checkpoint=DIR --hf_dir=OUT"));
}

// "gpt (gpt2), llama (llama)": the linked models that convert one way, with
// the model_types they declare; "none" when no model does.
std::string Converters(bool import) {
  std::vector<std::string> out;
  for (const ModelInfo* m : RegisteredModels()) {
    if (import ? !m->hf.import_folder : !m->hf.export_checkpoint) continue;
    out.push_back(m->hf.model_types.empty()
                      ? m->name
                      : absl::StrCat(m->name, " (", absl::StrJoin(m->hf.model_types, ", "), ")"));
  }
  return out.empty() ? "none" : absl::StrJoin(out, ", ");
}

// "llama.width=32,llama.num_layers=2,...": every field set in `message`,
// under the model's extension name (what --set takes).
std::string Overrides(const ModelInfo& model, const google::protobuf::Message& message) {
  const std::string prefix = ModelExtension(model)->name();
  std::vector<std::string> parts;
  const google::protobuf::Reflection* r = message.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(message, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    std::string value;
    google::protobuf::TextFormat::PrintFieldValueToString(message, f, -1, &value);
    parts.push_back(absl::StrCat(prefix, ".", f->name(), "=", value));
  }
  return absl::StrJoin(parts, ",");
}

// The model --model names, or the one whose registration declares the
// folder's config.json model_type.
absl::StatusOr<const ModelInfo*> ImportingModel(const std::string& hf_dir) {
  std::string model = absl::GetFlag(FLAGS_model);
  std::string source = absl::StrCat("--model=", model);
  if (model.empty()) {
    PP_ASSIGN_OR_RETURN(const std::string text,
                        ReadRegularFile("Hugging Face config", hf_dir + "/config.json"));
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(hf_dir, "/config.json is not a JSON object"));
    }
    PP_ASSIGN_OR_RETURN(model, HfStringField(j, "model_type", ""));
    if (model.empty()) {
      return Usage(absl::StrCat(hf_dir, "/config.json names no model_type: give --model (",
                                Converters(/*import=*/true), ")"));
    }
    source = absl::StrCat(hf_dir, "/config.json's model_type '", model, "'");
  }
  const ModelInfo* info = FindModel(model);
  if (info == nullptr) info = FindModelByHfType(model);
  if (info == nullptr || !info->hf.import_folder) {
    return Usage(absl::StrCat(source, " is not a model hf_convert imports; linked models with a ",
                              "Hugging Face import: ", Converters(/*import=*/true)));
  }
  return info;
}

absl::Status Import(const std::string& hf_dir, const std::string& root) {
  PP_ASSIGN_OR_RETURN(const ModelInfo* info, ImportingModel(hf_dir));
  PP_ASSIGN_OR_RETURN(const std::unique_ptr<google::protobuf::Message> config,
                      info->hf.import_folder(hf_dir, root));
  std::cout << "imported " << hf_dir << " into " << root << " (step 0)\n"
            << "--set=" << Overrides(*info, *config) << std::endl;
  return absl::OkStatus();
}

absl::Status Export(const std::string& checkpoint, const std::string& hf_dir) {
  PP_ASSIGN_OR_RETURN(const std::string dir, ResolveCheckpointDir(checkpoint));
  PP_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest, ReadManifest(dir));
  if (manifest.config().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", dir, " records no run config (an import?); export needs the model's shape"));
  }
  PP_ASSIGN_OR_RETURN(const ExperimentConfig config, ParseExperimentConfig(manifest.config()));
  PP_ASSIGN_OR_RETURN(const SelectedModel selected, SelectModel(config.model()));
  if (!selected.info->hf.export_checkpoint) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", dir, " is of model '", selected.info->name,
        "', which has no Hugging Face export; linked models with one: ", Converters(false)));
  }
  PP_RETURN_IF_ERROR(selected.info->hf.export_checkpoint(dir, *selected.config, hf_dir));
  std::cout << "exported " << dir << " (" << selected.info->name << ") to " << hf_dir << std::endl;
  return absl::OkStatus();
}

absl::Status Run(const std::vector<char*>& args) {
  if (args.size() != 2) return Usage("give one command, import or export");
  const std::string command = args[1];
  const std::string hf_dir = absl::GetFlag(FLAGS_hf_dir);
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  if (hf_dir.empty() || checkpoint.empty()) return Usage("--hf_dir and --checkpoint are needed");
  if (command == "import") return Import(hf_dir, checkpoint);
  if (command == "export") return Export(checkpoint, hf_dir);
  return Usage(absl::StrCat("unknown command '", command, "'"));
}

}  // namespace

int HfConvertMain(int argc, char** argv) {
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (absl::Status s = Run(args); !s.ok()) {
    std::cerr << "error: " << s.message() << std::endl;
    return 2;
  }
  return 0;
}

}  // namespace pp
