// Turns exceptions LibTorch throws (c10::Error and std::exception) into
// absl::Status at API boundaries: a step, a load, a collective.
//
//   absl::Status s = pp::TorchCall("all-reduce of tied grads", [&] { ... });
#ifndef COMMON_TORCH_STATUS_H_
#define COMMON_TORCH_STATUS_H_

#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include <c10/util/Exception.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace pp {

// Runs `fn` and returns OK, or kInternal naming `what` with the exception's
// message (c10::Error's message without its C++ backtrace).
template <typename Fn>
absl::Status TorchCall(const std::string& what, Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
    return absl::OkStatus();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

}  // namespace pp

#endif  // COMMON_TORCH_STATUS_H_
