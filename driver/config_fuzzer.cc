// Fuzz target: the experiment config loader with its --set overrides, and the
// resume comparison of a checkpoint's recorded config. The input is a config
// in protobuf text, then optionally a line "--" and one override
// ("dotted.path=value") per line. Every step must return a Status, never
// crash; a config that parses, takes its overrides and resolves must print
// and parse back to itself, and compare equal to itself on resume.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "driver/experiment_config.h"
#include "driver/resume_config.h"
#include "google/protobuf/stubs/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool silenced = [] {
    google::protobuf::SetLogHandler(nullptr);  // parse errors are expected here
    return true;
  }();
  (void)silenced;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find("\n--\n");
  const std::string text = input.substr(0, split);
  std::vector<std::string> overrides;
  if (split != std::string::npos) overrides = absl::StrSplit(input.substr(split + 4), '\n');

  std::vector<std::string> warnings;
  absl::StatusOr<pp::ExperimentConfig> config = pp::ParseExperimentConfig(text);
  if (!config.ok()) return 0;
  for (const std::string& o : overrides) {
    if (!pp::ApplyOverride(*config, o).ok()) return 0;
  }
  pp::ResolveDefaults(*config);
  const std::string printed = pp::ConfigToText(*config);
  absl::StatusOr<pp::ExperimentConfig> again = pp::ParseExperimentConfig(printed);
  if (!again.ok()) std::abort();                          // what we print must parse
  if (pp::ConfigToText(*again) != printed) std::abort();  // and print the same (NaN included)
  // A config compared with itself has no difference to report.
  if (!pp::CheckResumeConfig(printed, *config, &warnings).ok() || !warnings.empty()) std::abort();
  // The fuzzed text as a checkpoint's recorded config: any Status, no crash.
  (void)pp::CheckResumeConfig(text, *config, &warnings);
  return 0;
}
