#include "pipeline/partition/partitioner.h"

#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pp {
namespace {

struct Entry {
  std::string help;
  PartitionFn fn;
};

// Function-local statics: registration runs from static initializers of other
// translation units, whose order is unspecified.
std::mutex& RegistryMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::map<std::string, Entry>& Registry() {
  static auto* registry = new std::map<std::string, Entry>;
  return *registry;
}

}  // namespace

absl::Status RegisterPartitioner(const std::string& name, const std::string& help, PartitionFn fn) {
  if (name.empty() || name.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("partitioner name '", name, "' must be non-empty and contain no ':'"));
  }
  if (!fn)
    return absl::InvalidArgumentError(absl::StrCat("partitioner '", name, "' has no function"));
  std::lock_guard<std::mutex> lock(RegistryMutex());
  if (!Registry().emplace(name, Entry{help, std::move(fn)}).second) {
    return absl::AlreadyExistsError(absl::StrCat("partitioner '", name, "' is registered twice"));
  }
  return absl::OkStatus();
}

std::vector<std::string> RegisteredPartitioners() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::vector<std::string> names;
  for (const auto& [name, unused] : Registry()) names.push_back(name);
  return names;
}

std::string PartitionerHelp() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::string out;
  for (const auto& [name, entry] : Registry()) absl::StrAppend(&out, name, ": ", entry.help, "\n");
  return out;
}

absl::StatusOr<Bounds> Partition(const std::string& method, PartitionRequest request) {
  if (request.specs == nullptr)
    return absl::InvalidArgumentError("partition request has no spec list");
  if (absl::Status s = ValidateSpecs(*request.specs); !s.ok()) return s;
  const int64_t num_layers = static_cast<int64_t>(request.specs->size());
  if (absl::Status s = CheckEnoughLayers(num_layers, request.num_parts); !s.ok()) return s;
  const size_t colon = method.find(':');
  const std::string name = method.substr(0, colon);
  request.argument = colon == std::string::npos ? "" : method.substr(colon + 1);
  PartitionFn fn;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto it = Registry().find(name);
    if (it != Registry().end()) fn = it->second.fn;
  }
  if (!fn) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown partition method '", method,
                     "'; registered: ", absl::StrJoin(RegisteredPartitioners(), ", ")));
  }
  absl::StatusOr<Bounds> bounds = fn(request);
  if (!bounds.ok()) return bounds;
  if (absl::Status s = ValidateBounds(*bounds, num_layers, request.num_parts); !s.ok()) {
    return absl::InternalError(
        absl::StrCat("partitioner '", name, "' returned invalid bounds: ", s.message()));
  }
  return bounds;
}

std::string PartitionReport(const std::vector<LayerSpec>& specs, const Bounds& bounds,
                            int64_t num_stages, const std::vector<int64_t>& param_counts,
                            const std::vector<int>& placement) {
  std::ostringstream out;
  const int64_t num_parts = static_cast<int64_t>(bounds.size()) - 1;
  for (int64_t stage = 0; stage < num_stages; ++stage) {
    std::vector<int64_t> parts;
    for (int64_t part = 0; part < num_parts; ++part) {
      const bool here = placement.empty() ? part % num_stages == stage
                                          : part < static_cast<int64_t>(placement.size()) &&
                                                placement[part] == stage;
      if (here) parts.push_back(part);
    }
    for (int64_t chunk = 0; chunk < static_cast<int64_t>(parts.size()); ++chunk) {
      const int64_t part = parts[chunk];
      out << "stage=" << stage << " chunk=" << chunk << " (part " << part << ") layers=["
          << bounds[part] << ", " << bounds[part + 1] << ")";
      if (!param_counts.empty()) {
        int64_t total = 0;
        for (int64_t i = bounds[part]; i < bounds[part + 1]; ++i) total += param_counts[i];
        out << " params=" << total;
      }
      out << "\n";
      for (int64_t i = bounds[part]; i < bounds[part + 1]; ++i) {
        char index[32];
        std::snprintf(index, sizeof(index), "%6lld", static_cast<long long>(i));
        out << index << ": " << specs[i].name();
        if (specs[i].is_tied()) out << " [tied " << specs[i].tie_key() << "]";
        out << "\n";
      }
    }
  }
  return out.str();
}

namespace internal_partition {

bool RegisterOrDie(const char* name, const char* help, PartitionFn fn) {
  absl::Status status = RegisterPartitioner(name, help, std::move(fn));
  if (!status.ok()) {
    LOG(FATAL) << status.message();
  }
  return true;
}

}  // namespace internal_partition
}  // namespace pp
