// On-disk format and file-level I/O of pipe model checkpoints.
//
// A checkpoint is a directory `<root>/step_00000100/` holding tensor files
// (each a pickled dict name -> tensor written with torch::pickle_save, so
// Python's torch.load opens it) and `manifest.textproto` (checkpoint.Manifest:
// format version, topology, config, every file's size and CRC32C, every
// tensor's name/dtype/shape). `<root>/latest` names the newest complete one.
//
// Writing is atomic: files go to `<root>/.tmp-step_00000100/`, each fsynced;
// CommitCheckpoint merges the writers' partial manifests, fsyncs, renames the
// directory into place, fsyncs the root, and only then replaces `latest`.
// A crash at any point leaves the previous checkpoint and `latest` intact.
//
// This file knows nothing about models, ranks or optimizers; see
// checkpoint/model_checkpoint.h for the mapping of a pipeline model onto files.
#ifndef CHECKPOINT_MODEL_CHECKPOINT_IO_H_
#define CHECKPOINT_MODEL_CHECKPOINT_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/model/manifest.pb.h"
#include "common/crc32c.h"

namespace pp {

// Version written by this code; loaders refuse manifests with a larger one.
inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr char kCheckpointMagic[] = "pipe-checkpoint";
inline constexpr char kManifestFileName[] = "manifest.textproto";
inline constexpr char kLatestFileName[] = "latest";

// What one tensor file holds, in file order. Loaded into Python as a dict.
using TensorDict = std::vector<std::pair<std::string, at::Tensor>>;

// "step_00000100": the directory name of the checkpoint of `step`.
std::string CheckpointName(int64_t step);

// Pickles `tensors` as a dict, writes `<dir>/<rel_path>` and (with `sync`)
// fsyncs it. Returns its FileInfo (path, size, CRC32C, tensors); the caller
// fills kind, layer, tie_key and writer_rank. Tensors are saved contiguous,
// on CPU. A writer of many files passes sync=false and calls SyncFile on each
// at the end, so the kernel writes back one file while the next is written.
absl::StatusOr<checkpoint::FileInfo> WriteTensorFile(const std::string& dir,
                                                     const std::string& rel_path,
                                                     const TensorDict& tensors, bool sync = true);

// fsync(2) of a file or directory; errors name the path.
absl::Status SyncFile(const std::string& path);

// Reads `<dir>/<expected.path()>` and checks it against the manifest entry:
// size, CRC32C, and the names, dtypes and shapes of its tensors. Every error
// names the file and what differs.
// The tensors share a private copy-on-write mapping of the file (no copy;
// writing to them is safe and does not change the file).
absl::StatusOr<TensorDict> ReadTensorFile(const std::string& dir,
                                          const checkpoint::FileInfo& expected);

// Reads a tensor file without a manifest (e.g. one written by Python's
// torch.save of a dict of tensors). No integrity check beyond unpickling.
absl::StatusOr<TensorDict> ReadTensorFileUnchecked(const std::string& path);

// Writes `contents` to `path` via a temporary file, fsync and rename, then
// fsyncs the parent directory.
absl::Status WriteFileDurably(const std::string& path, const std::string& contents);

// Reads and validates `<dir>/manifest.textproto`: NotFound naming the
// directory when it is not a checkpoint, FailedPrecondition for a manifest
// from a newer format, InvalidArgument for an unparsable one.
absl::StatusOr<checkpoint::Manifest> ReadManifest(const std::string& dir);

// Resolves what a user passes to --resume: a checkpoint directory itself, or
// a root holding `latest`. Returns the checkpoint directory.
absl::StatusOr<std::string> ResolveCheckpointDir(const std::string& path);

// Complete checkpoints under `root` (directories named step_N with a
// manifest), oldest first. Temporary and foreign directories are ignored.
absl::StatusOr<std::vector<std::string>> ListCheckpoints(const std::string& root);

// Deletes all but the newest `keep_last` complete checkpoints (never the one
// `latest` names), and stale temporary directories. keep_last <= 0 keeps all.
absl::Status PruneCheckpoints(const std::string& root, int keep_last);

// --- The commit protocol, used by model_checkpoint with one or many writers ---

// `<root>/.tmp-<name>`.
std::string TempCheckpointDir(const std::string& root, const std::string& name);

// Creates an empty `<root>/.tmp-<name>` (removing a leftover one) and returns
// its path. Called by exactly one process before any writer starts.
absl::StatusOr<std::string> PrepareTempCheckpointDir(const std::string& root,
                                                     const std::string& name);

// A writer's list of the files it wrote, as `<tmp>/part-rank_NNNNN.textproto`
// (fsynced). Every writer calls it after its tensor files are durable.
absl::Status WritePartialManifest(const std::string& tmp_dir, int rank,
                                  const std::vector<checkpoint::FileInfo>& files);

// Called by exactly one process after every writer's WritePartialManifest
// returned: merges the parts into `header` (whose files must be empty), checks
// no file has two writers, writes the manifest, fsyncs, renames the temporary
// directory to `<root>/<name>` (replacing an older one of that name), fsyncs
// the root, updates `latest` and prunes to `keep_last`. Returns the final path.
absl::StatusOr<std::string> CommitCheckpoint(const std::string& root, const std::string& name,
                                             checkpoint::Manifest header, int keep_last);

}  // namespace pp

#endif  // CHECKPOINT_MODEL_CHECKPOINT_IO_H_
