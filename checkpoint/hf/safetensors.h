// The safetensors format (Hugging Face's model.safetensors), read and written
// here with nlohmann-json rather than a library: the format is an 8-byte
// little-endian header length, a JSON header {"name": {"dtype": "F32",
// "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}} and
// the raw little-endian row-major tensor bytes; the repo already carries
// nlohmann-json, and the only C++ implementation upstream is Rust/Python.
//
// Read loads the whole file (the reference models are small); errors name the
// file and the bad entry. Thread-compatible free functions.
#ifndef CHECKPOINT_HF_SAFETENSORS_H_
#define CHECKPOINT_HF_SAFETENSORS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pp {

struct SafetensorsFile {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;  // in file order
  std::map<std::string, std::string> metadata;
};

// Writes `file` to `path` (tensors made contiguous CPU copies; dtypes F64, F32,
// F16, BF16, I64, I32, I16, I8, U8, BOOL). InvalidArgument for another dtype or
// a duplicate name; an I/O error names the path.
absl::Status WriteSafetensors(const std::string& path, const SafetensorsFile& file);

// Reads `path`. InvalidArgument naming the file for a header that is not JSON,
// an unknown dtype, offsets outside the data or not matching dtype x shape.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

}  // namespace pp

#endif  // CHECKPOINT_HF_SAFETENSORS_H_
