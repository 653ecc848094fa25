#include "pipeline/runtime/action_observer.h"

#include <utility>

namespace pp {

ActionObservers::ActionObservers(std::vector<ActionObserver*> observers) {
  for (ActionObserver* o : observers) {
    if (o != nullptr) observers_.push_back(o);
  }
}

void ActionObservers::StepStart(const ObservedStep& step) {
  for (ActionObserver* o : observers_) o->StepStart(step);
}

void ActionObservers::ActionStart(const ObservedStep& step, const Action& action) {
  for (ActionObserver* o : observers_) o->ActionStart(step, action);
}

void ActionObservers::ActionEnd(const ObservedStep& step, const Action& action) {
  for (auto o = observers_.rbegin(); o != observers_.rend(); ++o) (*o)->ActionEnd(step, action);
}

void ActionObservers::CollectiveCompleted(const ObservedStep& step, const Action& started,
                                          int64_t completed_us) {
  for (ActionObserver* o : observers_) o->CollectiveCompleted(step, started, completed_us);
}

absl::Status ActionObservers::StepEnd(const ObservedStep& step, const absl::Status& status) {
  absl::Status first;
  for (auto o = observers_.rbegin(); o != observers_.rend(); ++o) {
    absl::Status s = (*o)->StepEnd(step, status);
    if (first.ok()) first = std::move(s);
  }
  return first;
}

}  // namespace pp
