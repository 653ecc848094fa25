// Timing device work with events: the part of the LibTorch differences
// (common/torch_compat.h) that the executor's action timer needs
// (pipeline/runtime/action_timer.h), in a target of its own so that a change
// here rebuilds only its users.
//
// c10::Event can time (elapsedTime, between two events made with
// c10::EventFlag::BACKEND_DEFAULT) in LibTorch 2.x only; 1.13 has no such
// call, and its Debian build has no CUDA anyway.
//
// Thread-safety: as c10::Event's.
#ifndef COMMON_TORCH_COMPAT_EVENTS_H_
#define COMMON_TORCH_COMPAT_EVENTS_H_

#include <optional>

#include <c10/core/Event.h>

namespace pp::torch_compat {

// Whether EventElapsedMilliseconds can time in this build (2.x).
bool DeviceEventsCanTime();

// Milliseconds of device time from `start` to `end`: two events of one device,
// made with c10::EventFlag::BACKEND_DEFAULT (timing on), both recorded and
// completed. nullopt where !DeviceEventsCanTime(): the caller then times on
// the host around a device wait.
std::optional<double> EventElapsedMilliseconds(const c10::Event& start, const c10::Event& end);

}  // namespace pp::torch_compat

#endif  // COMMON_TORCH_COMPAT_EVENTS_H_
