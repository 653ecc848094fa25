// The directory protocol of model checkpoints.
//
// A checkpoint is a directory `<root>/step_00000100/` holding tensor files
// (tensor_file.h) and `manifest.textproto` (checkpoint.Manifest: format
// version, topology, config, every file's size and CRC32C, every tensor's
// name/dtype/shape). `<root>/latest` names the newest complete one.
//
// Writing is atomic: files go to `<root>/.tmp-step_00000100/`, each fsynced;
// CommitCheckpoint merges the writers' partial manifests, fsyncs, renames the
// directory into place, fsyncs the root, and only then replaces `latest`.
// A crash at any point leaves the previous checkpoint and `latest` intact.
//
// This file knows nothing about models, ranks or optimizers; see
// checkpoint/model/model_checkpoint.h for the mapping of a pipeline model onto files.
#ifndef CHECKPOINT_MODEL_CHECKPOINT_DIR_H_
#define CHECKPOINT_MODEL_CHECKPOINT_DIR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/model/manifest.pb.h"

namespace pp {

// Version written by this code; loaders refuse manifests with a larger one.
inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr char kCheckpointMagic[] = "pipe-checkpoint";
inline constexpr char kManifestFileName[] = "manifest.textproto";
inline constexpr char kLatestFileName[] = "latest";

// "step_00000100": the directory name of the checkpoint of `step`.
std::string CheckpointName(int64_t step);

// Reads and validates `<dir>/manifest.textproto`: NotFound naming the
// directory when it is not a checkpoint, FailedPrecondition for a manifest
// from a newer format, InvalidArgument for an unparsable one, DataLoss naming
// the file when its last line ("# manifest crc32c: xxxxxxxx", written by
// CommitCheckpoint) does not match the text above it: the manifest was edited.
// (A manifest without that line, from an older pipe, is read as it is.)
[[nodiscard]] absl::StatusOr<checkpoint::Manifest> ReadManifest(const std::string& dir);

// Resolves what a user passes to --resume: a checkpoint directory itself, or
// a root holding `latest`. Returns the checkpoint directory.
[[nodiscard]] absl::StatusOr<std::string> ResolveCheckpointDir(const std::string& path);

// Complete checkpoints under `root` (directories named step_N with a
// manifest), oldest first. Temporary and foreign directories are ignored.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ListCheckpoints(const std::string& root);

// Reads every file the manifest of `dir` lists and checks its size and
// CRC32C (streaming, without unpickling). DataLoss naming the first file that
// is missing, truncated or corrupted; the manifest's own errors as
// ReadManifest.
[[nodiscard]] absl::Status VerifyCheckpointFiles(const std::string& dir);

// What resume=auto continues from under `root`.
struct ResumeChoice {
  // The checkpoint directory; empty when the root holds nothing a run wrote
  // (no `latest`, no step_N directory): start fresh.
  std::string dir;
  // Non-empty when `latest` was unusable and another checkpoint was chosen:
  // why, and what was skipped. The caller logs it loudly.
  std::string warning;
};

// The checkpoint `latest` names when it is a complete one (its manifest
// reads and its files all verify: VerifyCheckpointFiles). Otherwise (`latest`
// missing, empty, garbage, naming a missing, foreign, incomplete or corrupted
// directory)
// the newest step_N whose manifest reads and whose files all verify
// (VerifyCheckpointFiles), with a warning. FailedPrecondition naming what
// was found when the root holds checkpoints or `latest` but none is usable:
// starting over there would overwrite and prune them.
[[nodiscard]] absl::StatusOr<ResumeChoice> ChooseResumeCheckpoint(const std::string& root);

// OK when the checkpoint `dir` (whose manifest is `manifest`) was written by
// `owner`, or either is unknown (empty), or `allow_other_owner`.
// Otherwise FailedPrecondition naming the checkpoint, both runs and the
// override: two runs sharing a checkpoint dir must not continue from each
// other's checkpoints by accident.
[[nodiscard]] absl::Status CheckCheckpointOwner(const std::string& dir,
                                                const checkpoint::Manifest& manifest,
                                                const std::string& owner, bool allow_other_owner);

// OK when `root` does not exist or holds no checkpoint (no `latest`, no
// step_N directory, complete or not). Otherwise FailedPrecondition naming the
// root and its newest checkpoint: a fresh run that saves there would replace
// and prune checkpoints it did not write.
[[nodiscard]] absl::Status CheckRootHoldsNoCheckpoints(const std::string& root);

// Deletes all but the newest `keep_last` complete checkpoints (never the one
// `latest` names), and stale temporary directories (not those a save in
// progress holds: PrepareTempCheckpointDir's `hold`). keep_last <= 0 keeps all.
[[nodiscard]] absl::Status PruneCheckpoints(const std::string& root, int keep_last);

// --- The commit protocol, used by model_checkpoint with one or many writers ---

// `<root>/.tmp-<name>`, or `<root>/.tmp-<name>-<writer>` with a writer: each
// save (SaveCheckpoint draws a random writer token per save) has a temporary
// folder of its own, so two writers never fill or delete each other's.
std::string TempCheckpointDir(const std::string& root, const std::string& name,
                              const std::string& writer = "");

// Creates an empty TempCheckpointDir(root, name, writer) (removing a leftover
// one) and returns its path. Called by exactly one process before any writer
// starts. With `hold`, also takes an flock on the new directory and stores its
// descriptor there: PruneCheckpoints leaves a held temporary folder alone (a
// save in progress); the caller closes the descriptor after its commit.
[[nodiscard]] absl::StatusOr<std::string> PrepareTempCheckpointDir(const std::string& root,
                                                                   const std::string& name,
                                                                   const std::string& writer = "",
                                                                   int* hold = nullptr);

// A writer's list of the files it wrote, as `<tmp>/part-rank_NNNNN.textproto`
// (fsynced). Every writer calls it after its tensor files are durable.
[[nodiscard]] absl::Status WritePartialManifest(const std::string& tmp_dir, int rank,
                                                const std::vector<checkpoint::FileInfo>& files);

// Called by exactly one process after every writer's WritePartialManifest
// returned: merges the parts into `header` (whose files must be empty), checks
// no file has two writers, writes the manifest, fsyncs, renames the temporary
// directory to `<root>/<name>`, fsyncs the root, updates `latest` and prunes
// to `keep_last`. Returns the final path. An existing `<root>/<name>` is never
// deleted: it is renamed to `<name>.replaced-<k>` (the smallest free k >= 1),
// which pruning leaves alone, and a warning is logged.
// `writer` names the temporary folder (TempCheckpointDir).
[[nodiscard]] absl::StatusOr<std::string> CommitCheckpoint(const std::string& root,
                                                           const std::string& name,
                                                           checkpoint::Manifest header,
                                                           int keep_last,
                                                           const std::string& writer = "");

}  // namespace pp

#endif  // CHECKPOINT_MODEL_CHECKPOINT_DIR_H_
