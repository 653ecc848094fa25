// An ExperimentConfig (config.proto) as text: parsing a file, the command
// line's overrides ("--set=optimizer.lr=1e-3"), the resolved defaults and
// printing. Knows the registered models only by their config extensions
// ("gpt.width=256" names [pp.gpt]); checking the values is
// experiment_config.h's ValidateExperimentConfig.
#ifndef DRIVER_CONFIG_TEXT_H_
#define DRIVER_CONFIG_TEXT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "driver/config.pb.h"

namespace pp {

using driver::ExperimentConfig;

// Parses protobuf text; InvalidArgument with the parser's line:column message.
absl::StatusOr<ExperimentConfig> ParseExperimentConfig(const std::string& text);
// Reads and parses `path`; NotFound names the path.
absl::StatusOr<ExperimentConfig> LoadExperimentConfig(const std::string& path);

// Sets one field from "dotted.path=value" (e.g. "optimizer.lr=1e-3",
// "data.path=/tmp/text"); a registered model's name stands for its message
// ("gpt.num_layers=8" sets model { [pp.gpt] { num_layers: 8 } }).
// InvalidArgument for a bad form, an unknown field (listing the valid ones at
// that level), a message field, or a value that does not parse as the
// field's type.
absl::Status ApplyOverride(ExperimentConfig& config, absl::string_view assignment);

// One override of the command line: the flag as typed ("--precision=fp32",
// "--set=precision=bf16") and its "path=value".
struct CommandLineOverride {
  std::string flag;
  std::string assignment;
};

// OK when no field is set twice. Otherwise InvalidArgument naming the field
// and both flags: only one value would be taken, silently (issue #42, class
// 9), as a repeated flag is refused for the same reason.
absl::Status CheckOneValuePerField(const std::vector<CommandLineOverride>& overrides);

// Sets every unset field to its default, the model's message included, so
// the printed config is the complete, resolved one. An unset
// parallelism.partition_method becomes the model's default.
void ResolveDefaults(ExperimentConfig& config);

// Protobuf text of the whole config.
std::string ConfigToText(const ExperimentConfig& config);

}  // namespace pp

#endif  // DRIVER_CONFIG_TEXT_H_
