#include "checkpoint/model/tensor_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "topology/device_transfer.h"

namespace pp {
namespace {

namespace fs = std::filesystem;
using checkpoint::FileInfo;

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Bounds the wait for device->host copies of one file's tensors.
constexpr std::chrono::minutes kDeviceCopyTimeout(10);

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape.begin(), shape.end(), ", "), "]");
}

// WriteTensorFile's steps: check the names, copy to the host, then pickle
// into the file while counting its bytes and CRC32C.

absl::Status CheckTensorNames(const std::string& rel_path, const TensorDict& tensors) {
  std::set<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name '", name, "' appears twice in checkpoint file ", rel_path));
    }
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' for checkpoint file ", rel_path, " is undefined"));
    }
  }
  return absl::OkStatus();
}

// Device tensors (a GPU run's weights): copied into pinned host buffers
// asynchronously, one wait per device (topology/device.h ToHost).
absl::StatusOr<std::vector<at::Tensor>> CopyToHost(const std::string& path,
                                                   const TensorDict& tensors) {
  std::vector<at::Tensor> host;
  PP_RETURN_IF_ERROR(TorchCall(absl::StrCat("copying tensors for checkpoint file ", path), [&] {
    std::vector<at::Tensor> all;
    for (const auto& entry : tensors) all.push_back(entry.second.detach());
    absl::StatusOr<std::vector<at::Tensor>> on_host = ToHost(all, kDeviceCopyTimeout);
    if (!on_host.ok()) throw std::runtime_error(std::string(on_host.status().message()));
    host = *std::move(on_host);
  }));
  return host;
}

// Writes everything it is given to `fd`, with the running CRC32C and size.
struct FileSink {
  int fd;
  uint32_t crc = 0;
  int64_t size = 0;
  int write_errno = 0;  // the first write's failure; later writes are skipped

  size_t Write(const void* data, size_t n) {
    // After a failed write (a full disk) every later one is skipped but
    // reported as done: a short count makes the writer throw, and its
    // destructor then writes the end of the archive again and throws once
    // more, which terminates the process. The error is returned by the caller.
    if (write_errno != 0) return n;
    const char* p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < n) {
      ssize_t w = ::write(fd, p + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        write_errno = w < 0 ? errno : EIO;
        return n;
      }
      done += static_cast<size_t>(w);
    }
    crc = Crc32c(data, n, crc);
    size += static_cast<int64_t>(n);
    return n;
  }
};

// What torch::pickle_save writes (a zip archive holding data.pkl and one
// record per storage, which torch.load reads), streamed to `sink` instead of
// assembled in a growing buffer. Adds each tensor's name, dtype and shape to
// `info`.
absl::Status PickleInto(const std::string& path, const TensorDict& tensors,
                        const std::vector<at::Tensor>& host, FileSink& sink, FileInfo& info) {
  return TorchCall(absl::StrCat("writing checkpoint file ", path), [&] {
    c10::Dict<std::string, at::Tensor> dict;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::string& name = tensors[i].first;
      at::Tensor t = host[i].contiguous();
      // Pickle writes a tensor's whole storage; a view of a larger buffer
      // would drag the rest of it along.
      if (t.storage().nbytes() != static_cast<size_t>(t.numel()) * t.element_size() ||
          t.storage_offset() != 0) {
        t = t.clone();
      }
      dict.insert(name, t);
      checkpoint::TensorInfo* ti = info.add_tensors();
      ti->set_name(name);
      ti->set_dtype(c10::toString(t.scalar_type()));
      for (int64_t d : t.sizes()) ti->add_shape(d);
    }
    std::vector<char> pickle_bytes;
    torch::jit::Pickler pickler(
        [&](const char* buf, size_t n) { pickle_bytes.insert(pickle_bytes.end(), buf, buf + n); });
    pickler.protocol();
    pickler.pushIValue(c10::IValue(dict));
    pickler.stop();
    caffe2::serialize::PyTorchStreamWriter writer(
        [&](const void* data, size_t n) -> size_t { return sink.Write(data, n); });
    torch::jit::writeArchiveAndTensors("data", pickle_bytes.data(), pickle_bytes.size(),
                                       pickler.tensorData(), writer);
    writer.writeEndOfFile();
  });
}

}  // namespace

absl::StatusOr<FileInfo> WriteTensorFile(const std::string& dir, const std::string& rel_path,
                                         const TensorDict& tensors, bool sync) {
  FileInfo info;
  info.set_path(rel_path);
  info.set_layer(-1);
  PP_RETURN_IF_ERROR(CheckTensorNames(rel_path, tensors));
  const std::string path = (fs::path(dir) / rel_path).string();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot create checkpoint file ", path));
  absl::StatusOr<std::vector<at::Tensor>> host = CopyToHost(path, tensors);
  if (!host.ok()) {
    ::close(fd);
    return host.status();
  }
  FileSink sink{fd};
  absl::Status pickled = PickleInto(path, tensors, *host, sink, info);
  if (!pickled.ok() || sink.write_errno != 0) {
    ::close(fd);
    if (sink.write_errno != 0)
      return ErrnoStatus(sink.write_errno, absl::StrCat("cannot write checkpoint file ", path));
    return pickled;
  }
  if (sync && ::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot fsync checkpoint file ", path));
  }
  if (::close(fd) != 0) return ErrnoStatus(errno, absl::StrCat("cannot close ", path));
  info.set_size_bytes(sink.size);
  info.set_crc32c(sink.crc);
  return info;
}

namespace {

class MappedReadAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit MappedReadAdapter(std::shared_ptr<const MappedFile> file) : file_(std::move(file)) {}
  size_t size() const override { return file_->size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* what) const override {
    if (pos >= file_->size()) return 0;
    n = std::min<size_t>(n, file_->size() - pos);
    std::memcpy(buf, file_->data() + pos, n);
    return n;
  }

 private:
  std::shared_ptr<const MappedFile> file_;
};

// What torch::pickle_load does, reading from the mapping. With `zero_copy`
// (files this code wrote, whose checksum passed: records stored uncompressed)
// the tensors alias the mapping instead of being copied out of it.
absl::StatusOr<TensorDict> Unpickle(const std::string& path, std::shared_ptr<const MappedFile> file,
                                    bool zero_copy) {
  TensorDict out;
  std::string problem;
  PP_RETURN_IF_ERROR(TorchCall(absl::StrCat("unpickling checkpoint file ", path), [&] {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<MappedReadAdapter>(file));
    c10::IValue value;
    if (!zero_copy) {
      value = torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                                c10::nullopt, c10::nullopt, c10::nullopt, reader);
    } else {
      auto [pickle, pickle_size] = reader.getRecord("data.pkl");
      size_t pos = 0;
      auto read = [&, data = static_cast<const char*>(pickle.get())](char* buf, size_t n) {
        n = std::min(n, pickle_size - pos);
        std::memcpy(buf, data + pos, n);
        pos += n;
        return n;
      };
      auto read_record = [&](const std::string& key) -> at::DataPtr {
        const size_t offset = reader.getRecordOffset("data/" + key);
        TORCH_CHECK(offset < file->size(), "record data/", key, " lies outside the file");
        auto* owner = new std::shared_ptr<const MappedFile>(file);
        return at::DataPtr(
            const_cast<char*>(file->data() + offset), owner,
            [](void* ctx) { delete static_cast<std::shared_ptr<const MappedFile>*>(ctx); },
            at::Device(at::kCPU));
      };
      torch::jit::Unpickler unpickler(read, nullptr, nullptr, read_record, c10::nullopt);
      unpickler.set_version(reader.version());
      value = unpickler.parse_ivalue();
    }
    if (!value.isGenericDict()) {
      problem = absl::StrCat("holds a ", value.tagKind(), ", expected a dict of name -> tensor");
      return;
    }
    for (const auto& entry : value.toGenericDict()) {
      if (!entry.key().isString() || !entry.value().isTensor()) {
        problem = absl::StrCat("holds an entry ", entry.key().tagKind(), " -> ",
                               entry.value().tagKind(), ", expected string -> tensor");
        return;
      }
      out.emplace_back(entry.key().toStringRef(), entry.value().toTensor());
    }
  }));
  if (!problem.empty())
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " ", problem));
  return out;
}

}  // namespace

absl::StatusOr<TensorDict> ReadTensorFile(const std::string& dir, const FileInfo& expected) {
  std::string path = (fs::path(dir) / expected.path()).string();
  absl::StatusOr<std::shared_ptr<const MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) {
    if (absl::IsNotFound(file.status())) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint file ", path, " listed in the manifest is missing"));
    }
    return file.status();
  }
  const size_t size = (*file)->size();
  if (static_cast<int64_t>(size) != expected.size_bytes()) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint file %s is %d bytes, the manifest says %d (truncated or overwritten)", path,
        size, expected.size_bytes()));
  }
  uint32_t crc = Crc32c((*file)->data(), size);
  if (crc != expected.crc32c()) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint file %s fails its checksum: CRC32C %08x, the manifest says %08x (corrupted)",
        path, crc, expected.crc32c()));
  }
  PP_ASSIGN_OR_RETURN(TensorDict tensors, Unpickle(path, *file, /*zero_copy=*/true));
  if (tensors.size() != static_cast<size_t>(expected.tensors_size())) {
    return absl::DataLossError(
        absl::StrFormat("checkpoint file %s holds %d tensors, the manifest lists %d", path,
                        tensors.size(), expected.tensors_size()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const checkpoint::TensorInfo& want = expected.tensors(static_cast<int>(i));
    const auto& [name, t] = tensors[i];
    std::string dtype = c10::toString(t.scalar_type());
    if (name != want.name() || dtype != want.dtype() ||
        !std::equal(t.sizes().begin(), t.sizes().end(), want.shape().begin(), want.shape().end())) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, " tensor #", i, " is '",
                                              name, "' ", dtype, ShapeString(t.sizes()),
                                              ", the manifest says '", want.name(), "' ",
                                              want.dtype(), ShapeString(want.shape())));
    }
  }
  return tensors;
}

absl::StatusOr<TensorDict> ReadTensorFileUnchecked(const std::string& path) {
  PP_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  return Unpickle(path, file, /*zero_copy=*/false);
}

}  // namespace pp
