#include "driver/workspace_path.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

namespace pp {

namespace fs = std::filesystem;

std::string FromWorkspace(const std::string& path) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return workspace != nullptr ? (fs::path(workspace) / path).string() : path;
}

std::string FindShippedFile(const std::string& relative) {
  const std::string from_workspace = FromWorkspace(relative);
  if (fs::exists(from_workspace)) return from_workspace;
  // Run outside `bazel run` (bazel-bin/experiments/train_gpt from anywhere):
  // the config ships as a data dependency in the binary's runfiles.
  std::vector<fs::path> runfiles_dirs;
  if (const char* dir = std::getenv("RUNFILES_DIR")) runfiles_dirs.emplace_back(dir);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) runfiles_dirs.push_back(exe.string() + ".runfiles");
  for (const fs::path& dir : runfiles_dirs) {
    if (fs::exists(dir / "pipe" / relative)) return (dir / "pipe" / relative).string();
  }
  return relative;
}

}  // namespace pp
