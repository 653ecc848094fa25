// loss_curves: several runs' loss curves in one SVG, to compare them by eye.
//
//   ./bazelw run //observability:loss_curves -- --title="gpt_small_pp2: fp32 vs bf16"
//       --out=$PWD/docs/gpt_small_pp2_bf16_vs_fp32_loss.svg
//       fp32=/tmp/runs/gpt400_fp32-<time> bf16=/tmp/runs/gpt400_bf16-<time>
//
// (one command line, wrapped here without backslashes: gcc would join a
// comment's line ending in one to the next, and warns.)
//
// Each LABEL=RUN_DIR reads RUN_DIR/metrics.jsonl (what train_gpt, train_bert
// and train_llama write). Drawn by the writer of a run's own loss.svg
// (loss_curve.h), so the two read alike.
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "observability/loss_curve.h"

ABSL_FLAG(std::string, title, "loss", "the chart's title");
ABSL_FLAG(std::string, out, "", "the SVG file to write");

namespace pp {
namespace {

absl::Status Main(const std::vector<char*>& args) {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return absl::InvalidArgumentError("--out (the SVG file to write) is needed");
  if (args.size() < 2) {
    return absl::InvalidArgumentError("give at least one run as LABEL=RUN_DIR");
  }
  std::vector<LossRun> runs;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string spec = args[i];
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("run '", spec, "' must be LABEL=RUN_DIR (e.g. fp32=/tmp/runs/a)"));
    }
    PP_ASSIGN_OR_RETURN(LossRun run, ReadLossRun(spec.substr(0, eq), spec.substr(eq + 1)));
    runs.push_back(std::move(run));
  }
  std::ofstream file(out);
  file << LossCurvesSvg(absl::GetFlag(FLAGS_title), runs);
  file.close();
  if (!file) return absl::InternalError(absl::StrCat("could not write ", out));
  return absl::OkStatus();
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
