#include "driver/worker_status_observer.h"

#include "absl/strings/str_cat.h"
#include "topology/launcher_status.h"

namespace pp {

void WorkerStatusObserver::ActionStart(const ObservedStep& step, const Action& action) {
  if (!step.forward_only) ReportWorkerStep(step.step);
  ReportWorkerAction(absl::StrCat(step.forward_only ? "eval step " : "train step ", step.step, " ",
                                  ActionToString(action)));
}

}  // namespace pp
