#include "common/torch_compat_events.h"

#include <torch/version.h>

namespace pp::torch_compat {

bool DeviceEventsCanTime() { return TORCH_VERSION_MAJOR >= 2; }

std::optional<double> EventElapsedMilliseconds(const c10::Event& start, const c10::Event& end) {
#if TORCH_VERSION_MAJOR >= 2
  return start.elapsedTime(end);
#else
  (void)start;
  (void)end;
  return std::nullopt;
#endif
}

}  // namespace pp::torch_compat
