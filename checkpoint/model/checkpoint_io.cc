#include "checkpoint/model/checkpoint_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <system_error>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <sys/mman.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "google/protobuf/text_format.h"

namespace pp {
namespace {

namespace fs = std::filesystem;
using checkpoint::FileInfo;
using checkpoint::Manifest;

constexpr char kTempPrefix[] = ".tmp-";
constexpr char kOldPrefix[] = ".old-";
constexpr char kPartPrefix[] = "part-rank_";
constexpr char kStepPrefix[] = "step_";

std::string ErrnoMessage(int err) { return std::strerror(err); }

absl::Status ErrnoStatus(int err, const std::string& what) {
  std::string message = absl::StrCat(what, ": ", ErrnoMessage(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  return absl::InternalError(message);
}

absl::Status WriteAll(const std::string& path, const char* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot create checkpoint file ", path));
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, data + done, std::min<size_t>(size - done, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("cannot write checkpoint file ", path));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot fsync checkpoint file ", path));
  }
  if (::close(fd) != 0) return ErrnoStatus(errno, absl::StrCat("cannot close ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<char>> ReadAll(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open checkpoint file ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot stat ", path));
  }
  std::vector<char> data(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("cannot read ", path));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  data.resize(done);
  return data;
}

absl::Status FsyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", path, " to fsync it"));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("cannot fsync ", path));
  return absl::OkStatus();
}

absl::Status RemoveTree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot remove ", path.string(), ": ", ec.message()));
  return absl::OkStatus();
}

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape.begin(), shape.end(), ", "), "]");
}

// Step of a directory name "step_N", or -1.
int64_t StepOfName(const std::string& name) {
  absl::string_view rest(name);
  if (!absl::ConsumePrefix(&rest, kStepPrefix)) return -1;
  int64_t step = -1;
  if (!absl::SimpleAtoi(rest, &step) || step < 0) return -1;
  return step;
}

absl::StatusOr<std::string> ReadLatest(const std::string& root) {
  std::string path = (fs::path(root) / kLatestFileName).string();
  PP_ASSIGN_OR_RETURN(std::vector<char> data, ReadAll(path));
  std::string name(data.begin(), data.end());
  name = std::string(absl::StripAsciiWhitespace(name));
  if (name.empty() || name.find('/') != std::string::npos) {
    return absl::DataLossError(absl::StrCat(
        path, " should hold a checkpoint directory name like step_00000100, found '", name, "'"));
  }
  return name;
}

}  // namespace

std::string CheckpointName(int64_t step) { return absl::StrFormat("%s%08d", kStepPrefix, step); }

absl::Status SyncFile(const std::string& path) { return FsyncPath(path); }

absl::StatusOr<FileInfo> WriteTensorFile(const std::string& dir, const std::string& rel_path,
                                         const TensorDict& tensors, bool sync) {
  FileInfo info;
  info.set_path(rel_path);
  info.set_layer(-1);
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
  const std::string path = (fs::path(dir) / rel_path).string();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot create checkpoint file ", path));
  // What torch::pickle_save writes (a zip archive holding data.pkl and one
  // record per storage, which torch.load reads), streamed to the file instead
  // of assembled in a growing buffer, with the CRC32C computed on the way.
  uint32_t crc = 0;
  int64_t size = 0;
  int write_errno = 0;
  absl::Status pickled = TorchCall(absl::StrCat("writing checkpoint file ", path), [&] {
    c10::Dict<std::string, at::Tensor> dict;
    for (const auto& [name, tensor] : tensors) {
      at::Tensor t = tensor.detach().cpu().contiguous();
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
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) -> size_t {
      const char* p = static_cast<const char*>(data);
      size_t done = 0;
      while (done < n) {
        ssize_t w = ::write(fd, p + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
          write_errno = w < 0 ? errno : EIO;
          return done;
        }
        done += static_cast<size_t>(w);
      }
      crc = Crc32c(data, n, crc);
      size += static_cast<int64_t>(n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickle_bytes.data(), pickle_bytes.size(),
                                       pickler.tensorData(), writer);
    writer.writeEndOfFile();
  });
  if (!pickled.ok()) {
    ::close(fd);
    if (write_errno != 0)
      return ErrnoStatus(write_errno, absl::StrCat("cannot write checkpoint file ", path));
    return pickled;
  }
  if (sync && ::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot fsync checkpoint file ", path));
  }
  if (::close(fd) != 0) return ErrnoStatus(errno, absl::StrCat("cannot close ", path));
  info.set_size_bytes(size);
  info.set_crc32c(crc);
  return info;
}

namespace {

// A read-only mapping of a whole file: the CRC and the unpickler read the
// page cache directly, with no copy into a buffer first.
class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open checkpoint file ", path));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("cannot stat ", path));
    }
    auto file = std::shared_ptr<MappedFile>(new MappedFile());
    file->size_ = static_cast<size_t>(st.st_size);
    if (file->size_ > 0) {
      // Copy-on-write: tensors that alias the mapping (zero-copy loads) may
      // be written by their user without touching the file.
      void* p = ::mmap(nullptr, file->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        int err = errno;
        ::close(fd);
        return ErrnoStatus(err, absl::StrCat("cannot map ", path));
      }
      ::madvise(p, file->size_, MADV_SEQUENTIAL);
      file->data_ = static_cast<const char*>(p);
    }
    ::close(fd);
    return std::shared_ptr<const MappedFile>(std::move(file));
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile() = default;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

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

absl::Status WriteFileDurably(const std::string& path, const std::string& contents) {
  std::string tmp = absl::StrCat(path, ".tmp");
  PP_RETURN_IF_ERROR(WriteAll(tmp, contents.data(), contents.size()));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  std::string parent = fs::path(path).parent_path().string();
  return FsyncPath(parent.empty() ? "." : parent);
}

absl::StatusOr<Manifest> ReadManifest(const std::string& dir) {
  std::string path = (fs::path(dir) / kManifestFileName).string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", dir, " does not exist"));
  }
  absl::StatusOr<std::vector<char>> bytes = ReadAll(path);
  if (!bytes.ok()) {
    if (absl::IsNotFound(bytes.status())) {
      return absl::NotFoundError(absl::StrCat(dir, " is not a checkpoint: it has no ",
                                              kManifestFileName, " (and no '", kLatestFileName,
                                              "' file naming one)"));
    }
    return bytes.status();
  }
  Manifest manifest;
  std::string text(bytes->begin(), bytes->end());
  if (!google::protobuf::TextFormat::ParseFromString(text, &manifest)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint manifest ", path, " is not a valid text-format pp.checkpoint.Manifest"));
  }
  if (manifest.magic() != kCheckpointMagic) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint manifest ", path, " has magic '",
                                                   manifest.magic(), "', expected '",
                                                   kCheckpointMagic, "': not a pipe checkpoint"));
  }
  if (manifest.format_version() > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint manifest ", path, " has format_version ", manifest.format_version(),
        ", newer than this build reads (", kCheckpointFormatVersion, "); use a newer pipe"));
  }
  if (manifest.format_version() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint manifest ", path,
                                                   " has format_version ",
                                                   manifest.format_version(), ", expected 1.."));
  }
  return manifest;
}

absl::StatusOr<std::string> ResolveCheckpointDir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint path ", path, " is not a directory"));
  }
  if (fs::exists(fs::path(path) / kManifestFileName, ec)) return path;
  if (fs::exists(fs::path(path) / kLatestFileName, ec)) {
    PP_ASSIGN_OR_RETURN(std::string name, ReadLatest(path));
    std::string dir = (fs::path(path) / name).string();
    if (!fs::exists(fs::path(dir) / kManifestFileName, ec)) {
      return absl::NotFoundError(absl::StrCat((fs::path(path) / kLatestFileName).string(),
                                              " names ", name, " but ", dir,
                                              " is not a complete checkpoint"));
    }
    return dir;
  }
  return absl::NotFoundError(absl::StrCat(path, " is not a checkpoint: it has neither ",
                                          kManifestFileName, " nor a '", kLatestFileName,
                                          "' file"));
}

absl::StatusOr<std::vector<std::string>> ListCheckpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  if (ec)
    return absl::NotFoundError(
        absl::StrCat("cannot list checkpoint root ", root, ": ", ec.message()));
  for (const fs::directory_entry& entry : it) {
    std::string name = entry.path().filename().string();
    int64_t step = StepOfName(name);
    if (step < 0 || !entry.is_directory()) continue;
    if (!fs::exists(entry.path() / kManifestFileName, ec)) continue;
    found.emplace_back(step, name);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> names;
  for (auto& f : found) names.push_back(std::move(f.second));
  return names;
}

absl::Status PruneCheckpoints(const std::string& root, int keep_last) {
  std::error_code ec;
  // Leftovers of interrupted saves. Only called by the committing process,
  // after its own save finished, so no temp dir here is in use.
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, kTempPrefix) || absl::StartsWith(name, kOldPrefix)) {
      PP_RETURN_IF_ERROR(RemoveTree(entry.path()));
    }
  }
  if (keep_last <= 0) return absl::OkStatus();
  PP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListCheckpoints(root));
  absl::StatusOr<std::string> latest = ReadLatest(root);
  int excess = static_cast<int>(names.size()) - keep_last;
  for (int i = 0; i < excess; ++i) {
    if (latest.ok() && names[i] == *latest) continue;
    PP_RETURN_IF_ERROR(RemoveTree(fs::path(root) / names[i]));
  }
  return FsyncPath(root);
}

std::string TempCheckpointDir(const std::string& root, const std::string& name) {
  return (fs::path(root) / absl::StrCat(kTempPrefix, name)).string();
}

absl::StatusOr<std::string> PrepareTempCheckpointDir(const std::string& root,
                                                     const std::string& name) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot create checkpoint root ", root, ": ", ec.message()));
  std::string tmp = TempCheckpointDir(root, name);
  PP_RETURN_IF_ERROR(RemoveTree(tmp));
  fs::create_directory(tmp, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", ec.message()));
  return tmp;
}

absl::Status WritePartialManifest(const std::string& tmp_dir, int rank,
                                  const std::vector<FileInfo>& files) {
  Manifest part;
  for (const FileInfo& f : files) *part.add_files() = f;
  std::string text;
  google::protobuf::TextFormat::PrintToString(part, &text);
  std::string path =
      (fs::path(tmp_dir) / absl::StrFormat("%s%05d.textproto", kPartPrefix, rank)).string();
  return WriteAll(path, text.data(), text.size());
}

absl::StatusOr<std::string> CommitCheckpoint(const std::string& root, const std::string& name,
                                             Manifest header, int keep_last) {
  std::string tmp = TempCheckpointDir(root, name);
  header.clear_files();
  header.set_magic(kCheckpointMagic);
  header.set_format_version(kCheckpointFormatVersion);
  // Merge the parts in rank order so the manifest is deterministic.
  std::vector<fs::path> parts;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(tmp, ec)) {
    if (absl::StartsWith(entry.path().filename().string(), kPartPrefix))
      parts.push_back(entry.path());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", tmp, ": ", ec.message()));
  std::sort(parts.begin(), parts.end());
  std::map<std::string, int> writer_of;
  std::vector<FileInfo> files;
  for (const fs::path& part_path : parts) {
    PP_ASSIGN_OR_RETURN(std::vector<char> bytes, ReadAll(part_path.string()));
    Manifest part;
    if (!google::protobuf::TextFormat::ParseFromString(std::string(bytes.begin(), bytes.end()),
                                                       &part)) {
      return absl::DataLossError(
          absl::StrCat("partial manifest ", part_path.string(), " does not parse"));
    }
    for (const FileInfo& f : part.files()) {
      auto [it, inserted] = writer_of.emplace(f.path(), f.writer_rank());
      if (!inserted) {
        return absl::InternalError(absl::StrCat("checkpoint file ", f.path(),
                                                " was written by both rank ", it->second,
                                                " and rank ", f.writer_rank()));
      }
      files.push_back(f);
    }
  }
  std::sort(files.begin(), files.end(), [](const FileInfo& a, const FileInfo& b) {
    if (a.kind() != b.kind()) return a.kind() < b.kind();
    if (a.layer() != b.layer()) return a.layer() < b.layer();
    return a.path() < b.path();
  });
  for (FileInfo& f : files) *header.add_files() = std::move(f);
  std::string text;
  google::protobuf::TextFormat::PrintToString(header, &text);
  std::string manifest_path = (fs::path(tmp) / kManifestFileName).string();
  PP_RETURN_IF_ERROR(WriteAll(manifest_path, text.data(), text.size()));
  for (const fs::path& part_path : parts) fs::remove(part_path, ec);
  PP_RETURN_IF_ERROR(FsyncPath(tmp));

  std::string final_dir = (fs::path(root) / name).string();
  std::string old_dir = (fs::path(root) / absl::StrCat(kOldPrefix, name)).string();
  if (fs::exists(final_dir, ec)) {
    // Saving a step that already has a checkpoint (e.g. right after resuming):
    // move the old one aside first, since rename() cannot replace a directory.
    PP_RETURN_IF_ERROR(RemoveTree(old_dir));
    if (::rename(final_dir.c_str(), old_dir.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("cannot move ", final_dir, " aside"));
    }
  }
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot rename ", tmp, " to ", final_dir));
  }
  PP_RETURN_IF_ERROR(FsyncPath(root));
  PP_RETURN_IF_ERROR(WriteFileDurably((fs::path(root) / kLatestFileName).string(), name + "\n"));
  PP_RETURN_IF_ERROR(PruneCheckpoints(root, keep_last));
  return final_dir;
}

}  // namespace pp
