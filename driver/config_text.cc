#include "driver/config_text.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "models/registry.h"

namespace pp {
namespace {

namespace gpb = google::protobuf;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// Collects parser errors as "line L:C: message".
class ErrorCollector : public gpb::io::ErrorCollector {
 public:
  void AddError(int line, gpb::io::ColumnNumber column, const std::string& message) override {
    absl::StrAppend(&errors_, errors_.empty() ? "" : "; ", "line ", line + 1, ":", column + 1, ": ",
                    message);
  }
  const std::string& errors() const { return errors_; }

 private:
  std::string errors_;
};

std::vector<std::string> FieldNames(const gpb::Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return names;
}

void FillDefaults(gpb::Message& message) {
  const gpb::Reflection* r = message.GetReflection();
  const gpb::Descriptor* d = message.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const gpb::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    if (f->cpp_type() == gpb::FieldDescriptor::CPPTYPE_MESSAGE) {
      FillDefaults(*r->MutableMessage(&message, f));
      continue;
    }
    if (r->HasField(message, f)) continue;
    switch (f->cpp_type()) {
      case gpb::FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(&message, f, f->default_value_int32());
        break;
      case gpb::FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(&message, f, f->default_value_int64());
        break;
      case gpb::FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(&message, f, f->default_value_uint32());
        break;
      case gpb::FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(&message, f, f->default_value_uint64());
        break;
      case gpb::FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(&message, f, f->default_value_double());
        break;
      case gpb::FieldDescriptor::CPPTYPE_FLOAT:
        r->SetFloat(&message, f, f->default_value_float());
        break;
      case gpb::FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(&message, f, f->default_value_bool());
        break;
      case gpb::FieldDescriptor::CPPTYPE_STRING:
        r->SetString(&message, f, f->default_value_string());
        break;
      case gpb::FieldDescriptor::CPPTYPE_ENUM:
        r->SetEnum(&message, f, f->default_value_enum());
        break;
      default:
        break;
    }
  }
  // The model's own message (an extension of ModelConfig) gets its defaults too.
  std::vector<const gpb::FieldDescriptor*> set;
  r->ListFields(message, &set);
  for (const gpb::FieldDescriptor* f : set) {
    if (f->is_extension() && !f->is_repeated() &&
        f->cpp_type() == gpb::FieldDescriptor::CPPTYPE_MESSAGE) {
      FillDefaults(*r->MutableMessage(&message, f));
    }
  }
}

}  // namespace

absl::StatusOr<ExperimentConfig> ParseExperimentConfig(const std::string& text) {
  ExperimentConfig config;
  gpb::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return Invalid(absl::StrCat(
        "config does not parse as ExperimentConfig (driver/config.proto): ", errors.errors(),
        " (models linked into this binary: ", absl::StrJoin(RegisteredModelNames(), ", "), ")"));
  }
  return config;
}

absl::StatusOr<ExperimentConfig> LoadExperimentConfig(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config '", path, "' is not a regular file (",
        std::filesystem::is_directory(path, ec) ? "a directory" : "a FIFO, device or socket",
        "); pass --config=experiments/configs/<name>.textproto"));
  }
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        "cannot read config '", path, "'; pass --config=experiments/configs/<name>.textproto"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  absl::StatusOr<ExperimentConfig> config = ParseExperimentConfig(buffer.str());
  if (!config.ok()) return Invalid(absl::StrCat(path, ": ", config.status().message()));
  return config;
}

absl::Status ApplyOverride(ExperimentConfig& config, absl::string_view assignment) {
  const size_t eq = assignment.find('=');
  if (eq == absl::string_view::npos || eq == 0) {
    return Invalid(absl::StrCat("override '", assignment,
                                "' must look like field.path=value, e.g. optimizer.lr=1e-3"));
  }
  const std::string path(assignment.substr(0, eq));
  const std::string value(assignment.substr(eq + 1));
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  const gpb::Descriptor* d = ExperimentConfig::descriptor();
  std::string text_open, text_close;
  size_t first = 0;
  // "gpt.width=256": a registered model's name stands for its message,
  // model { [pp.gpt] { width: 256 } }.
  if (const ModelInfo* model = FindModel(parts[0]);
      model != nullptr && d->FindFieldByName(parts[0]) == nullptr && parts.size() > 1) {
    const gpb::FieldDescriptor* extension = ModelExtension(*model);
    if (extension == nullptr)
      return absl::InternalError(absl::StrCat("model '", parts[0], "' has no extension"));
    absl::StrAppend(&text_open, "model { [", extension->full_name(), "] { ");
    text_close = " } }";
    d = extension->message_type();
    first = 1;
  }
  for (size_t i = first; i < parts.size(); ++i) {
    const gpb::FieldDescriptor* f = d->FindFieldByName(parts[i]);
    if (f == nullptr) {
      const std::string models =
          i == 0 ? absl::StrCat("; or a model's field: <model>.<field> with <model> one of ",
                                absl::StrJoin(RegisteredModelNames(), ", "))
                 : "";
      return Invalid(absl::StrCat("unknown config field '", path, "': ", d->full_name(),
                                  " has no field '", parts[i],
                                  "' (valid: ", absl::StrJoin(FieldNames(d), ", "), models, ")"));
    }
    const bool last = i + 1 == parts.size();
    if (f->cpp_type() == gpb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (last) {
        return Invalid(absl::StrCat("config field '", path,
                                    "' is a message; set one of its fields (",
                                    absl::StrJoin(FieldNames(f->message_type()), ", "), ")"));
      }
      absl::StrAppend(&text_open, parts[i], " { ");
      text_close += " }";
      d = f->message_type();
      continue;
    }
    if (!last)
      return Invalid(
          absl::StrCat("config field '", parts[i], "' in '", path, "' is not a message"));
    std::string literal = value;
    if (f->cpp_type() == gpb::FieldDescriptor::CPPTYPE_STRING)
      literal = absl::StrCat("\"", absl::CEscape(value), "\"");
    absl::StrAppend(&text_open, parts[i], ": ", literal);
  }
  gpb::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  // Merging keeps the other fields.
  if (!parser.MergeFromString(text_open + text_close, &config)) {
    return Invalid(absl::StrCat("cannot set ", path, " to '", value, "': ", errors.errors()));
  }
  return absl::OkStatus();
}

absl::Status CheckOneValuePerField(const std::vector<CommandLineOverride>& overrides) {
  std::map<std::string, const CommandLineOverride*> by_field;
  for (const CommandLineOverride& o : overrides) {
    const std::string field = o.assignment.substr(0, o.assignment.find('='));
    const auto [it, inserted] = by_field.emplace(field, &o);
    if (inserted) continue;
    return Invalid(absl::StrCat("config field '", field, "' is given twice, by ", it->second->flag,
                                " and by ", o.flag, "; only one would be taken, so give it once"));
  }
  return absl::OkStatus();
}

void ResolveDefaults(ExperimentConfig& config) {
  // The partition method the model is cut by unless the config names one
  // (GPT and BERT: their block type).
  if (absl::StatusOr<SelectedModel> model = SelectModel(config.model());
      model.ok() && !config.parallelism().has_partition_method()) {
    config.mutable_parallelism()->set_partition_method(model->info->default_partition_method);
  }
  FillDefaults(config);
}

std::string ConfigToText(const ExperimentConfig& config) {
  std::string text;
  gpb::TextFormat::PrintToString(config, &text);
  return text;
}

}  // namespace pp
