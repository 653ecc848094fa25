// `type:<regex>`: balance the number of layers whose spec name matches the
// regex (case-insensitive, ECMAScript, matched anywhere in the name like
// DeepSpeed's re.search). A regex that matches no layer is an error.
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipeline/partition/partitioner.h"

namespace pp {
namespace {

absl::StatusOr<Bounds> PartitionByType(const PartitionRequest& request) {
  if (request.argument.empty()) {
    return absl::InvalidArgumentError(
        "partition method 'type' needs a regex: 'type:<regex>', e.g. 'type:TransformerBlock'");
  }
  std::regex pattern;
  try {
    pattern = std::regex(request.argument, std::regex::ECMAScript | std::regex::icase);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("'type:", request.argument, "': invalid regex (", e.what(), ")"));
  }
  const std::vector<LayerSpec>& specs = *request.specs;
  std::vector<double> costs(specs.size(), 0.0);
  bool any = false;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (std::regex_search(specs[i].name(), pattern)) {
      costs[i] = 1.0;
      any = true;
    }
  }
  if (!any) {
    std::vector<std::string> names;
    for (const LayerSpec& spec : specs) names.push_back(spec.name());
    return absl::InvalidArgumentError(
        absl::StrCat("'type:", request.argument,
                     "' matches no layer; layer names: ", absl::StrJoin(names, ", ")));
  }
  return BalancedBounds(costs, request.num_parts);
}

}  // namespace

PP_REGISTER_PARTITIONER(
    "type", "type:<regex> balances the count of layers whose name matches (case-insensitive)",
    &PartitionByType);

}  // namespace pp
