// WorkerStatusObserver: writes the name of every action as it starts into
// the launcher's status page (topology/launcher_status.h), so a worker that
// dies or stops is named with its last action ("train step 54 1B2"). A copy
// into shared memory per action; the driver installs it only in a launched
// worker (WorkerStatusEnabled()).
#ifndef DRIVER_WORKER_STATUS_OBSERVER_H_
#define DRIVER_WORKER_STATUS_OBSERVER_H_

#include "pipeline/runtime/action_observer.h"

namespace pp {

class WorkerStatusObserver : public ActionObserver {
 public:
  void ActionStart(const ObservedStep& step, const Action& action) override;
};

}  // namespace pp

#endif  // DRIVER_WORKER_STATUS_OBSERVER_H_
