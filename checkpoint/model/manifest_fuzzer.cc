// Fuzz target: the checkpoint manifest reader and verifier, and what resume
// reads from a checkpoint root (`latest`). The input is written as a
// checkpoint directory's manifest.textproto (first byte even) or as a root's
// `latest` file next to one real checkpoint (first byte odd); every reader
// must return a Status, never crash, hang or accept a manifest naming a file
// outside its directory.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/model/checkpoint_dir.h"
#include "google/protobuf/stubs/logging.h"

namespace {

namespace fs = std::filesystem;

const std::string& Root() {
  static const std::string* root = [] {
    google::protobuf::SetLogHandler(nullptr);  // parse errors are expected here
    const char* base = std::getenv("TEST_TMPDIR");
    auto* r = new std::string((fs::path(base != nullptr ? base : "/tmp") /
                               ("manifest_fuzzer_" + std::to_string(getpid())))
                                  .string());
    fs::remove_all(*r);
    fs::create_directories(fs::path(*r) / pp::CheckpointName(3));
    // A real (empty) checkpoint for `latest` to name.
    std::ofstream(fs::path(*r) / pp::CheckpointName(3) / pp::kManifestFileName)
        << "magic: \"pipe-checkpoint\"\nformat_version: 1\n";
    return r;
  }();
  return *root;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string root = Root();
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    const std::string dir = (fs::path(root) / "step_00000001").string();
    fs::create_directories(dir);
    std::ofstream(fs::path(dir) / pp::kManifestFileName, std::ios::binary | std::ios::trunc)
        << text;
    (void)pp::ReadManifest(dir);
    const absl::Status verified = pp::VerifyCheckpointFiles(dir);
    // Only a manifest with no files (or files that exist in `dir`) verifies.
    if (verified.ok()) {
      auto manifest = pp::ReadManifest(dir);
      if (!manifest.ok()) std::abort();
      for (const auto& f : manifest->files()) {
        if (f.path().find('/') != std::string::npos || f.path() == ".." || f.path().empty()) {
          std::abort();  // a file outside the checkpoint was accepted
        }
      }
    }
    (void)pp::ListCheckpoints(root);
    fs::remove_all(dir);
  } else {
    std::ofstream(fs::path(root) / pp::kLatestFileName, std::ios::binary | std::ios::trunc) << text;
    (void)pp::ResolveCheckpointDir(root);
    auto choice = pp::ChooseResumeCheckpoint(root);
    // Whatever `latest` says, the real checkpoint is what resume finds.
    if (!choice.ok() || choice->dir != (fs::path(root) / pp::CheckpointName(3)).string()) {
      std::abort();
    }
  }
  return 0;
}
