// The absl flags of run_observability.h. In a file of their own: absl's
// FLAGS_v must not meet glog's (a gflags variable of the same name) in one
// translation unit.
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(int, v, 0,
          "glog verbosity on every rank (logs/rank_<N>.log): 1 logs each executed action's start "
          "and end with its micro-batch, peer and duration");
ABSL_FLAG(std::string, profile_steps, "",
          "A:B (or A alone): record steps A to B (1-based, as in metrics.jsonl) with LibTorch's "
          "profiler on every rank; writes <run>/profile/rank_<N>.json and merged.json");

namespace pp {

int VerbosityFlag() { return absl::GetFlag(FLAGS_v); }
std::string ProfileStepsFlag() { return absl::GetFlag(FLAGS_profile_steps); }

}  // namespace pp
