// Tensor files of model checkpoints: a pickled dict name -> tensor (what
// torch::pickle_save writes, so Python's torch.load opens it), written with its
// size and CRC32C computed on the way, read back zero-copy from a mapping and
// checked against its manifest entry (checkpoint.FileInfo).
#ifndef CHECKPOINT_MODEL_TENSOR_FILE_H_
#define CHECKPOINT_MODEL_TENSOR_FILE_H_

#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "absl/status/statusor.h"
#include "checkpoint/model/manifest.pb.h"

namespace pp {

// What one tensor file holds, in file order. Loaded into Python as a dict.
using TensorDict = std::vector<std::pair<std::string, at::Tensor>>;

// Pickles `tensors` as a dict, writes `<dir>/<rel_path>` and (with `sync`)
// fsyncs it. Returns its FileInfo (path, size, CRC32C, tensors); the caller
// fills kind, layer, tie_key and writer_rank. Tensors are saved contiguous,
// on CPU. A writer of many files passes sync=false and calls SyncFile on each
// at the end, so the kernel writes back one file while the next is written.
[[nodiscard]] absl::StatusOr<checkpoint::FileInfo> WriteTensorFile(const std::string& dir,
                                                                   const std::string& rel_path,
                                                                   const TensorDict& tensors,
                                                                   bool sync = true);

// Reads `<dir>/<expected.path()>` and checks it against the manifest entry:
// size, CRC32C, and the names, dtypes and shapes of its tensors. Every error
// names the file and what differs.
// The tensors share a private copy-on-write mapping of the file (no copy;
// writing to them is safe and does not change the file).
[[nodiscard]] absl::StatusOr<TensorDict> ReadTensorFile(const std::string& dir,
                                                        const checkpoint::FileInfo& expected);

// Reads a tensor file without a manifest (e.g. one written by Python's
// torch.save of a dict of tensors). No integrity check beyond unpickling.
[[nodiscard]] absl::StatusOr<TensorDict> ReadTensorFileUnchecked(const std::string& path);

}  // namespace pp

#endif  // CHECKPOINT_MODEL_TENSOR_FILE_H_
