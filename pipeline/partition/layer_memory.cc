#include "pipeline/partition/layer_memory.h"

#include <algorithm>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "c10/core/Allocator.h"
#include "c10/util/ThreadLocalDebugInfo.h"
#include "common/torch_compat_memory.h"

namespace pp {
namespace internal_partition {

Layer BuildForProfiling(const std::vector<LayerSpec>& specs, size_t i, uint64_t base_seed,
                        const std::map<std::string, std::vector<int64_t>>& tie_positions,
                        std::map<std::string, Layer>* shared) {
  const LayerSpec& spec = specs[i];
  if (!spec.is_tied()) return BuildSpecLayer(spec, static_cast<int64_t>(i), base_seed);
  Layer& module = (*shared)[spec.tie_key()];
  if (module == nullptr) {
    const int64_t first = tie_positions.at(spec.tie_key()).front();
    module = BuildSpecLayer(specs[first], first, base_seed);
  }
  return std::make_shared<TiedLayer>(spec.name(), spec.tie_key(), module, spec.tied_forward_fn());
}

Activations DetachForNextLayer(const Activations& outputs) {
  Activations next;
  for (const torch::Tensor& t : outputs) {
    torch::Tensor d = t.defined() ? t.detach() : t;
    if (d.defined() && d.is_floating_point()) d.requires_grad_(true);
    next.push_back(d);
  }
  return next;
}

}  // namespace internal_partition

namespace {

// Counts the bytes allocated and freed while installed (thread-safe: intra-op
// threads report too).
class ByteCounter : public torch_compat::MemoryReporterBase {
 public:
  void OnAllocation(int64_t alloc_size) override {
    std::lock_guard<std::mutex> lock(mu_);
    live_ += alloc_size;
    peak_ = std::max(peak_, live_);
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_;
  }
  int64_t peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

 private:
  mutable std::mutex mu_;
  int64_t live_ = 0;
  int64_t peak_ = 0;
};

int64_t TensorBytes(const Activations& tensors) {
  int64_t bytes = 0;
  for (const torch::Tensor& t : tensors) {
    if (t.defined()) bytes += static_cast<int64_t>(t.numel() * t.element_size());
  }
  return bytes;
}

void AppendShapes(const torch::Tensor& t, std::string* key) {
  if (!t.defined()) {
    absl::StrAppend(key, "undef;");
    return;
  }
  absl::StrAppend(key, std::string(c10::toString(t.scalar_type())), t.device().str(), "[");
  for (int64_t d : t.sizes()) absl::StrAppend(key, d, ",");
  absl::StrAppend(key, "];");
}

std::string CacheKey(const std::vector<LayerSpec>& specs, const Activations& inputs,
                     const MicroBatch& batch, uint64_t seed) {
  std::string key = absl::StrCat("seed=", seed, ";");
  for (const LayerSpec& spec : specs) absl::StrAppend(&key, spec.name(), "|", spec.tie_key(), ";");
  for (const torch::Tensor& t : inputs) AppendShapes(t, &key);
  for (const auto& [name, t] : batch.tensors) {
    absl::StrAppend(&key, name, "=");
    AppendShapes(t, &key);
  }
  return key;
}

std::mutex& CacheMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<std::string, std::vector<LayerMemory>>& Cache() {
  static auto* cache = new std::map<std::string, std::vector<LayerMemory>>;
  return *cache;
}

}  // namespace

absl::StatusOr<std::vector<LayerMemory>> MeasureLayerMemory(const std::vector<LayerSpec>& specs,
                                                            const Activations& sample_inputs,
                                                            const MicroBatch& sample_batch,
                                                            uint64_t base_seed) {
  if (sample_inputs.empty() && sample_batch.tensors.empty()) {
    return absl::InvalidArgumentError(
        "measuring layer memory needs sample inputs or a sample micro-batch for the first "
        "layer; both are empty");
  }
  const std::string key = CacheKey(specs, sample_inputs, sample_batch, base_seed);
  {
    std::lock_guard<std::mutex> lock(CacheMutex());
    auto it = Cache().find(key);
    if (it != Cache().end()) return it->second;
  }
  const auto tie_positions = TiePositions(specs);
  std::map<std::string, Layer> shared;
  std::vector<LayerMemory> result(specs.size());
  Activations inputs = internal_partition::DetachForNextLayer(sample_inputs);
  for (size_t i = 0; i < specs.size(); ++i) {
    try {
      Layer layer =
          internal_partition::BuildForProfiling(specs, i, base_seed, tie_positions, &shared);
      for (const torch::Tensor& p : layer->parameters()) {
        result[i].parameter_bytes += static_cast<int64_t>(p.numel() * p.element_size());
      }
      Activations outputs;
      auto counter = std::make_shared<ByteCounter>();
      {
        c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, counter);
        outputs = layer->Forward(inputs, sample_batch);
        result[i].activation_bytes = counter->live();
        result[i].forward_peak_bytes = counter->peak();
      }
      result[i].output_bytes = TensorBytes(outputs);
      inputs = internal_partition::DetachForNextLayer(outputs);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("measuring layer ", i, " ('", specs[i].name(),
                                                     "') failed: ", ExceptionMessage(e)));
    }
  }
  std::lock_guard<std::mutex> lock(CacheMutex());
  Cache()[key] = result;
  return result;
}

}  // namespace pp
