// Paths a person typed, and files a binary ships, as seen from a binary that
// `bazel run` starts in its runfiles tree.
#ifndef DRIVER_WORKSPACE_PATH_H_
#define DRIVER_WORKSPACE_PATH_H_

#include <string>

namespace pp {

// `path` relative to the workspace the person ran `bazel run` in
// (BUILD_WORKSPACE_DIRECTORY); absolute paths and runs outside `bazel run`
// keep it as it is.
std::string FromWorkspace(const std::string& path);

// A workspace-relative file shipped as a data dependency: from the workspace
// when it is there, else from the binary's runfiles (bazel-bin/... run from
// anywhere); `relative` unchanged when neither has it.
std::string FindShippedFile(const std::string& relative);

}  // namespace pp

#endif  // DRIVER_WORKSPACE_PATH_H_
