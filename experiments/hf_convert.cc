// hf_convert: pipe checkpoints <-> Hugging Face folders (config.json +
// model.safetensors; checkpoint/hf/README.md).
//
//   hf_convert import --model=llama|gpt2 --hf_dir=DIR --checkpoint=ROOT
//       a transformers LlamaForCausalLM / GPT2LMHeadModel folder (e.g. from
//       save_pretrained) -> step 0 of a pipe checkpoint under ROOT, loadable
//       at any pp/dp layout; prints the model's config fields as a --set
//       override to fine-tune it: train_llama --resume=ROOT --set=...
//   hf_convert export --checkpoint=DIR --hf_dir=OUT
//       a pipe checkpoint (a step directory or a root with `latest`) of a run
//       of llama or gpt -> a folder transformers loads; the model and its
//       shape come from the run config the checkpoint records.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/hf/gpt2_hf.h"
#include "checkpoint/hf/llama_hf.h"
#include "checkpoint/model/checkpoint_dir.h"
#include "common/status_macros.h"
#include "driver/experiment_config.h"
#include "google/protobuf/text_format.h"
#include "models/gpt/gpt_config.pb.h"
#include "models/llama/llama_model_config.h"
#include "models/registry.h"

ABSL_FLAG(std::string, model, "llama",
          "import: llama (LlamaForCausalLM) or gpt2 (GPT2LMHeadModel)");
ABSL_FLAG(std::string, hf_dir, "", "the Hugging Face folder (read by import, written by export)");
ABSL_FLAG(std::string, checkpoint, "",
          "import: the pipe checkpoint root to write; export: the checkpoint to read");

namespace pp {
namespace {

absl::Status Usage(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(
      what,
      "; usage: hf_convert import --model=llama|gpt2 --hf_dir=DIR --checkpoint=ROOT, or "
      "hf_convert export --checkpoint=DIR --hf_dir=OUT"));
}

// "llama.width=32,llama.num_layers=2,...": every field set in `message`.
std::string Overrides(const std::string& model, const google::protobuf::Message& message) {
  std::vector<std::string> parts;
  const google::protobuf::Reflection* r = message.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(message, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    std::string value;
    google::protobuf::TextFormat::PrintFieldValueToString(message, f, -1, &value);
    parts.push_back(absl::StrCat(model, ".", f->name(), "=", value));
  }
  return absl::StrJoin(parts, ",");
}

absl::Status Import(const std::string& hf_dir, const std::string& root) {
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model == "llama") {
    PP_ASSIGN_OR_RETURN(LlamaConfig config, ImportLlamaHf(hf_dir, root));
    std::cout << "imported " << hf_dir << " into " << root << " (step 0)\n"
              << "--set=" << Overrides("llama", ToLlamaModelConfig(config)) << std::endl;
    return absl::OkStatus();
  }
  if (model == "gpt2") {
    PP_ASSIGN_OR_RETURN(GptConfig config, ImportGpt2Hf(hf_dir, root));
    GptModelConfig m;
    m.set_context_length(config.context_length);
    m.set_width(config.width);
    m.set_num_heads(config.num_heads);
    m.set_num_layers(config.num_layers);
    m.set_mlp_ratio(config.mlp_ratio);
    std::cout << "imported " << hf_dir << " into " << root << " (step 0)\n"
              << "--set=" << Overrides("gpt", m) << std::endl;
    return absl::OkStatus();
  }
  return Usage(absl::StrCat("--model=", model, " is not llama or gpt2"));
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
  if (selected.info->name == "llama") {
    const auto& m = static_cast<const LlamaModelConfig&>(*selected.config);
    PP_RETURN_IF_ERROR(ExportLlamaCheckpoint(dir, ToLlamaConfig(m), hf_dir));
  } else if (selected.info->name == "gpt") {
    const auto& m = static_cast<const GptModelConfig&>(*selected.config);
    const GptConfig c{.context_length = m.context_length(),
                      .width = m.width(),
                      .num_heads = m.num_heads(),
                      .num_layers = m.num_layers(),
                      .mlp_ratio = m.mlp_ratio(),
                      .dropout = m.dropout()};
    PP_RETURN_IF_ERROR(ExportGptCheckpoint(dir, c, hf_dir));
  } else {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", dir, " is of model '",
                                                   selected.info->name,
                                                   "'; hf_convert exports llama and gpt"));
  }
  std::cout << "exported " << dir << " (" << selected.info->name << ") to " << hf_dir << std::endl;
  return absl::OkStatus();
}

absl::Status Main(const std::vector<char*>& args) {
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
}  // namespace pp

int main(int argc, char** argv) {
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (absl::Status s = pp::Main(args); !s.ok()) {
    std::cerr << "error: " << s.message() << std::endl;
    return 2;
  }
  return 0;
}
