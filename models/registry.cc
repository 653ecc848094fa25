#include "models/registry.h"

#include <map>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pp {
namespace {

namespace gpb = google::protobuf;

// Keyed by name; extension numbers are checked on insertion.
std::map<std::string, ModelInfo>& Registry() {
  static auto* registry = new std::map<std::string, ModelInfo>();
  return *registry;
}

}  // namespace

void RegisterModel(ModelInfo info) {
  CHECK(!info.name.empty()) << "PP_REGISTER_MODEL: a model needs a name";
  CHECK(info.specs && info.loss && info.data)
      << "PP_REGISTER_MODEL(" << info.name << "): specs, loss and data are required";
  auto& registry = Registry();
  auto it = registry.find(info.name);
  CHECK(it == registry.end()) << "model '" << info.name << "' registered twice: '"
                              << it->second.description << "' and '" << info.description << "'";
  for (const auto& [name, other] : registry) {
    CHECK(other.extension_number != info.extension_number)
        << "models '" << name << "' and '" << info.name << "' both extend pp.ModelConfig with "
        << "field number " << info.extension_number << "; give one another number";
  }
  for (const std::string& type : info.hf.model_types) {
    const ModelInfo* other = FindModelByHfType(type);
    CHECK(other == nullptr) << "models '" << other->name << "' and '" << info.name
                            << "' both import Hugging Face model_type '" << type
                            << "'; a model_type belongs to one model";
  }
  std::string name = info.name;
  registry.emplace(std::move(name), std::move(info));
}

std::vector<const ModelInfo*> RegisteredModels() {
  std::vector<const ModelInfo*> models;
  for (const auto& [name, info] : Registry()) models.push_back(&info);
  return models;
}

std::vector<std::string> RegisteredModelNames() {
  std::vector<std::string> names;
  for (const auto& [name, info] : Registry()) names.push_back(name);
  return names;
}

const ModelInfo* FindModel(const std::string& name) {
  auto it = Registry().find(name);
  return it == Registry().end() ? nullptr : &it->second;
}

const ModelInfo* FindModelByExtension(int extension_number) {
  for (const auto& [name, info] : Registry()) {
    if (info.extension_number == extension_number) return &info;
  }
  return nullptr;
}

const ModelInfo* FindModelByHfType(const std::string& model_type) {
  for (const auto& [name, info] : Registry()) {
    for (const std::string& type : info.hf.model_types) {
      if (type == model_type) return &info;
    }
  }
  return nullptr;
}

const gpb::FieldDescriptor* ModelExtension(const ModelInfo& model) {
  return gpb::DescriptorPool::generated_pool()->FindExtensionByNumber(ModelConfig::descriptor(),
                                                                      model.extension_number);
}

absl::Status CheckBlocksPerPart(const ModelRun& run, int64_t num_blocks,
                                absl::string_view num_blocks_field) {
  const int64_t parts = run.pp * run.chunks;
  if (parts <= num_blocks) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("parallelism.pp (", run.pp, ") x parallelism.chunks (", run.chunks,
                   ") = ", parts, " model parts, but the model has only ", num_blocks, " blocks (",
                   num_blocks_field, "); use at most ", num_blocks, " parts or more layers"));
}

absl::StatusOr<SelectedModel> SelectModel(const ModelConfig& config) {
  std::vector<const gpb::FieldDescriptor*> set;
  config.GetReflection()->ListFields(config, &set);
  const std::string valid = absl::StrCat("the models linked into this binary: ",
                                         absl::StrJoin(RegisteredModelNames(), ", "));
  if (set.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the config names no model; set model { [pp.<model>] { ... } } with one of ", valid));
  }
  if (set.size() > 1) {
    std::vector<std::string> names;
    for (const gpb::FieldDescriptor* f : set) names.push_back(f->full_name());
    return absl::InvalidArgumentError(absl::StrCat("the config's model section sets ",
                                                   absl::StrJoin(names, " and "),
                                                   "; set exactly one (", valid, ")"));
  }
  if (const ModelInfo* info = FindModelByExtension(set[0]->number()); info != nullptr) {
    return SelectedModel{info, set[0], &config.GetReflection()->GetMessage(config, set[0])};
  }
  return absl::InvalidArgumentError(absl::StrCat("model [", set[0]->full_name(),
                                                 "] is not registered in this binary (", valid,
                                                 "); link its registration"));
}

}  // namespace pp
