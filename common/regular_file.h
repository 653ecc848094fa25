// Opening and reading files named by users (token files, tokenizers, Hugging
// Face folders, checkpoints) only when they are regular files: opening a FIFO
// blocks until a writer comes, and a device (/dev/zero) never ends, so either
// would hang the launcher or a worker. Every file reader of user input goes
// through here, so the check lives in one place (issue #42, class 4).
#ifndef COMMON_REGULAR_FILE_H_
#define COMMON_REGULAR_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pp {

// A read-only descriptor (O_CLOEXEC, blocking) of `path`, a regular file
// after following links; the caller closes it. Opened without blocking, so a
// FIFO is refused rather than waited on. NotFound when `path` does not exist;
// InvalidArgument "<what> '<path>' is a FIFO (...); give a regular file" for a
// FIFO, socket, device or directory; errors naming the path otherwise.
[[nodiscard]] absl::StatusOr<int> OpenRegularFile(absl::string_view what, const std::string& path);

// The whole of the regular file `path` (errors as OpenRegularFile).
[[nodiscard]] absl::StatusOr<std::string> ReadRegularFile(absl::string_view what,
                                                          const std::string& path);

}  // namespace pp

#endif  // COMMON_REGULAR_FILE_H_
