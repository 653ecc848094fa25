#include "checkpoint/hf/safetensors.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/regular_file.h"
#include "nlohmann/json.hpp"

namespace pp {
namespace {

struct DtypeName {
  torch::ScalarType type;
  const char* name;
};

constexpr DtypeName kDtypes[] = {{torch::kFloat64, "F64"}, {torch::kFloat32, "F32"},
                                 {torch::kFloat16, "F16"}, {torch::kBFloat16, "BF16"},
                                 {torch::kInt64, "I64"},   {torch::kInt32, "I32"},
                                 {torch::kInt16, "I16"},   {torch::kInt8, "I8"},
                                 {torch::kUInt8, "U8"},    {torch::kBool, "BOOL"}};

const char* NameOf(torch::ScalarType type) {
  for (const DtypeName& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  return nullptr;
}

// Little-endian hosts only (x86-64, aarch64): tensor bytes are copied as is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors is little-endian");

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const SafetensorsFile& file) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::vector<torch::Tensor> data;
  std::set<std::string> names;
  int64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    if (!names.insert(name).second || name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name \"", name, "\" is repeated or reserved"));
    }
    const char* dtype = NameOf(tensor.scalar_type());
    if (dtype == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", name, " has dtype ",
                                                     c10::toString(tensor.scalar_type()),
                                                     ", which safetensors cannot hold here"));
    }
    torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    header[name] = {
        {"dtype", dtype}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(t);
  }
  std::string json = header.dump();
  // The data starts 8-byte aligned (the format pads the header with spaces).
  json.append((8 - (json.size() % 8)) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  const uint64_t size = json.size();
  char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  out.write(le, 8);
  out.write(json.data(), static_cast<std::streamsize>(json.size()));
  for (const torch::Tensor& t : data) {
    out.write(static_cast<const char*>(t.data_ptr()),
              static_cast<std::streamsize>(t.numel() * t.element_size()));
  }
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  absl::StatusOr<std::string> read = ReadRegularFile("safetensors file", path);
  if (!read.ok()) return read.status();
  const std::string bytes = *std::move(read);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (bytes.size() < 8) return bad(absl::StrCat("file of ", bytes.size(), " bytes has no header"));
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_size > bytes.size() - 8) {
    return bad(absl::StrCat("header length ", header_size, " exceeds the file (", bytes.size(),
                            " bytes)"));
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::parse(
      bytes.substr(8, header_size), nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return bad("the header is not a JSON object");
  const char* data = bytes.data() + 8 + header_size;
  const auto data_size = static_cast<int64_t>(bytes.size() - 8 - header_size);
  SafetensorsFile file;
  std::map<int64_t, std::pair<int64_t, std::string>> spans;  // begin -> (end, tensor)
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return bad("__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) return bad(absl::StrCat("metadata ", k, " is not a string"));
        file.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets") || !entry["dtype"].is_string() ||
        !entry["shape"].is_array() || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      return bad(absl::StrCat("tensor ", name, ": entry ", entry.dump(),
                              " needs dtype, shape and data_offsets [begin, end]"));
    }
    const std::string dtype = entry["dtype"].get<std::string>();
    const DtypeName* type = nullptr;
    for (const DtypeName& d : kDtypes) {
      if (dtype == d.name) type = &d;
    }
    if (type == nullptr) return bad(absl::StrCat("tensor ", name, ": unknown dtype ", dtype));
    std::vector<int64_t> shape;
    int64_t numel = 1;
    for (const auto& dim : entry["shape"]) {
      if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
        return bad(absl::StrCat("tensor ", name, ": bad shape ", entry["shape"].dump()));
      }
      shape.push_back(dim.get<int64_t>());
      // A product beyond int64 would wrap; no file holds that many bytes.
      if (__builtin_mul_overflow(numel, shape.back(), &numel)) {
        return bad(absl::StrCat("tensor ", name, ": shape ", entry["shape"].dump(),
                                " has more elements than any file can hold"));
      }
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_integer() || !offsets[1].is_number_integer()) {
      return bad(absl::StrCat("tensor ", name, ": bad data_offsets ", offsets.dump()));
    }
    const auto begin = offsets[0].get<int64_t>();
    const auto end = offsets[1].get<int64_t>();
    int64_t want = 0;
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(c10::elementSize(type->type)), &want)) {
      return bad(absl::StrCat("tensor ", name, ": shape ", entry["shape"].dump(),
                              " has more bytes than any file can hold"));
    }
    if (begin < 0 || end < begin || end > data_size || end - begin != want) {
      return bad(absl::StrCat("tensor ", name, ": data_offsets [", begin, ", ", end,
                              "] do not hold ", dtype, " ", entry["shape"].dump(), " (", want,
                              " bytes) within the ", data_size, " data bytes"));
    }
    // Two tensors sharing bytes is a corrupt header (Hugging Face's reader
    // refuses it too); empty tensors occupy nothing.
    if (begin < end) {
      const auto next = spans.lower_bound(begin);
      if ((next != spans.end() && next->first < end) ||
          (next != spans.begin() && std::prev(next)->second.first > begin)) {
        const auto& other = next != spans.end() && next->first < end ? *next : *std::prev(next);
        return bad(absl::StrCat("tensor ", name, ": data_offsets [", begin, ", ", end,
                                "] overlap those of tensor ", other.second.second, " [",
                                other.first, ", ", other.second.first, "]"));
      }
      spans[begin] = {end, name};
    }
    torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(type->type));
    std::memcpy(t.data_ptr(), data + begin, static_cast<size_t>(want));
    file.tensors.emplace_back(name, t);
  }
  return file;
}

}  // namespace pp
