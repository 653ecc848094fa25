// Fuzz target: the schedule action parser (pipeline/schedule/ir/action.h), as it
// reads a hand-written schedule or a --schedule_actions list. The input is one
// action (ParseAction) and a list (ParseActions). Beyond "no crash": whatever
// parses prints back to text that parses to the same action(s), with a stage
// and micro-batch present exactly when the type has them, never negative.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "pipeline/schedule/ir/action.h"

namespace {

void CheckAction(const pp::Action& a) {
  if (pp::HasStage(a.type) ? a.stage < 0 : a.stage != -1) std::abort();
  if (pp::HasMicrobatch(a.type) ? a.microbatch < 0 : a.microbatch != -1) std::abort();
  absl::StatusOr<pp::Action> again = pp::ParseAction(pp::ActionToString(a));
  if (!again.ok() || *again != a) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pp::Action> action = pp::ParseAction(text);
  if (action.ok()) CheckAction(*action);
  absl::StatusOr<std::vector<pp::Action>> actions = pp::ParseActions(text);
  if (actions.ok()) {
    for (const pp::Action& a : *actions) CheckAction(a);
    absl::StatusOr<std::vector<pp::Action>> again = pp::ParseActions(pp::ActionsToString(*actions));
    if (!again.ok() || *again != *actions) std::abort();
  }
  return 0;
}
