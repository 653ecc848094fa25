#include "driver/resume_config.h"

#include <utility>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/registry.h"

namespace pp {
namespace {

namespace gpb = google::protobuf;

// Field paths whose difference does not change the training.
bool IgnoredOnResume(const std::string& path) {
  for (const char* prefix :
       {"name", "output_dir", "log_interval", "eval_interval", "eval_batches", "sample_",
        "trace_step", "checkpoint.", "parallelism.timeout_seconds"}) {
    if (absl::StartsWith(path, prefix)) return true;
  }
  return false;
}

// Differences that make the continuation another training run.
bool BreaksResume(const std::string& path) {
  const std::string first = path.substr(0, path.find('.'));
  return first == "model" || FindModel(first) != nullptr || path == "seed" ||
         path == "optimizer.name";
}

// "path: A in the checkpoint, B now" for every leaf field that differs.
// The model's message (an extension of ModelConfig) is named by the model
// ("gpt.num_heads"); another model is reported as `model`.
void DiffModels(const gpb::Message& saved, const gpb::Message& now,
                std::vector<std::pair<std::string, std::string>>& out);

void DiffConfigs(const gpb::Message& saved, const gpb::Message& now, const std::string& prefix,
                 std::vector<std::pair<std::string, std::string>>& out) {
  const gpb::Descriptor* d = now.GetDescriptor();
  const gpb::Reflection* rs = saved.GetReflection();
  const gpb::Reflection* rn = now.GetReflection();
  if (d == ModelConfig::descriptor()) return DiffModels(saved, now, out);
  for (int i = 0; i < d->field_count(); ++i) {
    const gpb::FieldDescriptor* f = d->field(i);
    const std::string path = prefix + f->name();
    if (f->is_repeated()) {
      std::string a, b;
      for (int k = 0; k < rs->FieldSize(saved, f); ++k) {
        std::string v;
        gpb::TextFormat::PrintFieldValueToString(saved, f, k, &v);
        absl::StrAppend(&a, k ? ", " : "", v);
      }
      for (int k = 0; k < rn->FieldSize(now, f); ++k) {
        std::string v;
        gpb::TextFormat::PrintFieldValueToString(now, f, k, &v);
        absl::StrAppend(&b, k ? ", " : "", v);
      }
      if (a != b)
        out.emplace_back(path, absl::StrCat("[", a, "] in the checkpoint, [", b, "] now"));
      continue;
    }
    if (f->cpp_type() == gpb::FieldDescriptor::CPPTYPE_MESSAGE) {
      DiffConfigs(rs->GetMessage(saved, f), rn->GetMessage(now, f), path + ".", out);
      continue;
    }
    std::string a, b;
    gpb::TextFormat::PrintFieldValueToString(saved, f, -1, &a);
    gpb::TextFormat::PrintFieldValueToString(now, f, -1, &b);
    if (a != b) out.emplace_back(path, absl::StrCat(a, " in the checkpoint, ", b, " now"));
  }
}

void DiffModels(const gpb::Message& saved, const gpb::Message& now,
                std::vector<std::pair<std::string, std::string>>& out) {
  std::vector<const gpb::FieldDescriptor*> a, b;
  saved.GetReflection()->ListFields(saved, &a);
  now.GetReflection()->ListFields(now, &b);
  // Models by their registered names ("bert"), else their extensions.
  const auto names = [](const std::vector<const gpb::FieldDescriptor*>& fields) {
    std::vector<std::string> n;
    for (const gpb::FieldDescriptor* f : fields) {
      const ModelInfo* model = FindModelByExtension(f->number());
      n.push_back(model != nullptr ? model->name : absl::StrCat("[", f->full_name(), "]"));
    }
    return n.empty() ? std::string("(none)") : absl::StrJoin(n, " and ");
  };
  if (a.empty() && b.empty()) return;  // neither names a model: nothing to compare
  if (a.size() != 1 || b.size() != 1 || a[0] != b[0]) {
    out.emplace_back("model", absl::StrCat(names(a), " in the checkpoint, ", names(b), " now"));
    return;
  }
  if (a[0]->cpp_type() != gpb::FieldDescriptor::CPPTYPE_MESSAGE || a[0]->is_repeated()) return;
  const ModelInfo* model = FindModelByExtension(a[0]->number());
  DiffConfigs(saved.GetReflection()->GetMessage(saved, a[0]),
              now.GetReflection()->GetMessage(now, b[0]),
              (model != nullptr ? model->name : std::string("model")) + ".", out);
}

}  // namespace

absl::Status CheckResumeConfig(const std::string& saved_text, const ExperimentConfig& now,
                               std::vector<std::string>* warnings) {
  if (saved_text.empty()) {
    warnings->push_back(
        "the checkpoint records no experiment config; its settings cannot be compared");
    return absl::OkStatus();
  }
  absl::StatusOr<ExperimentConfig> saved = ParseExperimentConfig(saved_text);
  if (!saved.ok()) {
    warnings->push_back(absl::StrCat("the checkpoint's experiment config does not parse here (",
                                     saved.status().message(), "); it cannot be compared"));
    return absl::OkStatus();
  }
  std::vector<std::pair<std::string, std::string>> diffs;
  DiffConfigs(*saved, now, "", diffs);
  std::vector<std::string> breaking;
  for (const auto& [path, what] : diffs) {
    if (IgnoredOnResume(path)) continue;
    if (path == "parallelism.tp") {
      // Loading merges the ranks' shards and cuts the new ones
      // (checkpoint/model/model_checkpoint.h); the RNG state carries over.
      warnings->push_back(absl::StrCat(
          "resuming at another tensor-parallel size (", path, ": ", what,
          "): the checkpoint's shards are merged and split again; the run continues as it would "
          "have, to rounding"));
      continue;
    }
    const std::string line = absl::StrCat(path, ": ", what);
    if (BreaksResume(path)) {
      breaking.push_back(line);
    } else {
      warnings->push_back(
          absl::StrCat("resuming with a changed setting (the run will not equal "
                       "an uninterrupted one): ",
                       line));
    }
  }
  if (breaking.empty()) return absl::OkStatus();
  if (now.checkpoint().allow_config_change()) {
    for (const std::string& line : breaking) {
      warnings->push_back(absl::StrCat(
          "resuming with a changed model/seed/optimizer (checkpoint.allow_config_change): ", line));
    }
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the checkpoint was written by a different run: ", absl::StrJoin(breaking, "; "),
      ". Resume with the checkpoint's settings, or set checkpoint.allow_config_change=true "
      "(--set=checkpoint.allow_config_change=true) to continue anyway"));
}

}  // namespace pp
