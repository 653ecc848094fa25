#include "pipeline/tie_analysis.h"

#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pp {
namespace {

// Two parameter entries are the same parameter when they view the same bytes
// the same way. A TensorImpl shared by two registrations is the usual case.
using ParamKey = std::tuple<const void*, int64_t, std::vector<int64_t>, std::vector<int64_t>>;

ParamKey KeyOf(const torch::Tensor& t) {
  return {t.storage().unsafeGetStorageImpl(), t.storage_offset(), t.sizes().vec(),
          t.strides().vec()};
}

// A module with the same parameter/buffer tree as `source`, minus the tensors
// already in `seen`, holding the very same tensors (no copy). It gives the
// shared module global names without registering a tensor twice.
std::shared_ptr<torch::nn::Module> Mirror(const torch::nn::Module& source,
                                          std::set<ParamKey>* seen) {
  auto mirror = std::make_shared<torch::nn::Module>(ShortTypeName(source.name()));
  for (const auto& item : source.named_parameters(/*recurse=*/false)) {
    if (seen->insert(KeyOf(item.value())).second) {
      mirror->register_parameter(item.key(), item.value(), item.value().requires_grad());
    }
  }
  for (const auto& item : source.named_buffers(/*recurse=*/false)) {
    if (item.value().defined() && seen->insert(KeyOf(item.value())).second) {
      mirror->register_buffer(item.key(), item.value());
    }
  }
  for (const auto& child : source.named_children()) {
    mirror->register_module(child.key(), Mirror(*child.value(), seen));
  }
  return mirror;
}

// The shared module of one tie group found in a Sequential: the group's
// original children, each reachable by its index in the Sequential, and every
// tensor registered once (under the first child that has it).
class SharedGroupLayer : public LayerImpl {
 public:
  explicit SharedGroupLayer(std::map<int64_t, torch::nn::AnyModule> children)
      : LayerImpl("SharedGroup"), children_(std::move(children)) {
    std::set<ParamKey> seen;
    for (const auto& [index, child] : children_) {
      register_module(std::to_string(index), Mirror(*child.ptr(), &seen));
    }
  }

  Activations Forward(const Activations& inputs, const MicroBatch& batch) override {
    return RunChild(children_.begin()->first, inputs);
  }

  Activations RunChild(int64_t index, const Activations& inputs) {
    TORCH_CHECK(inputs.size() == 1, "Sequential child ", index, " takes one tensor but received ",
                inputs.size());
    return {children_.at(index).forward(inputs[0])};
  }

  // The children are not registered (their tensors are, through the mirrors),
  // so train/eval must reach them here.
  void train(bool on) override {
    torch::nn::Module::train(on);
    for (auto& [unused, child] : children_) child.ptr()->train(on);
  }

 private:
  std::map<int64_t, torch::nn::AnyModule> children_;
};

int64_t Find(std::vector<int64_t>& parent, int64_t x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

}  // namespace

std::vector<std::vector<std::string>> FindTiedParameters(const torch::nn::Module& module) {
  std::map<ParamKey, size_t> group_of;
  std::vector<std::vector<std::string>> groups;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    auto [it, inserted] = group_of.emplace(KeyOf(item.value()), groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back(item.key());
  }
  std::vector<std::vector<std::string>> tied;
  for (auto& group : groups) {
    if (group.size() >= 2) tied.push_back(std::move(group));
  }
  return tied;
}

absl::StatusOr<std::vector<LayerSpec>> SpecsFromSequential(torch::nn::Sequential seq) {
  std::vector<torch::nn::AnyModule> children(seq->begin(), seq->end());
  const int64_t n = static_cast<int64_t>(children.size());
  if (n == 0)
    return absl::InvalidArgumentError("SpecsFromSequential: the Sequential has no children");

  // Union children that hold a common tensor, by storage identity, before
  // anything is copied.
  std::vector<int64_t> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  std::map<ParamKey, int64_t> owner;
  for (int64_t i = 0; i < n; ++i) {
    for (const torch::Tensor& p : children[i].ptr()->parameters()) {
      auto [it, inserted] = owner.emplace(KeyOf(p), i);
      if (!inserted) parent[Find(parent, i)] = Find(parent, it->second);
    }
  }
  std::map<int64_t, std::map<int64_t, torch::nn::AnyModule>> groups;  // root -> members
  for (int64_t i = 0; i < n; ++i) groups[Find(parent, i)].emplace(i, children[i]);

  std::vector<LayerSpec> specs;
  std::map<int64_t, Layer> shared_of_root;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t root = Find(parent, i);
    const auto& members = groups.at(root);
    const std::string type = ShortTypeName(children[i].ptr()->name());
    if (members.size() == 1) {
      torch::nn::AnyModule child = children[i];
      specs.push_back(LayerSpec(type, [child](const LayerContext&) {
                        return std::make_shared<ModuleLayer>(child);
                      }).WithParameterCount(CountTrainableParameters(*child.ptr())));
      continue;
    }
    Layer& shared = shared_of_root[root];
    if (shared == nullptr) shared = std::make_shared<SharedGroupLayer>(members);
    const std::string key = absl::StrCat("shared_", members.begin()->first);
    specs.push_back(TiedLayerSpec(
                        key, [shared](const LayerContext&) { return shared; },
                        [i](LayerImpl& module, const Activations& inputs, const MicroBatch&) {
                          return static_cast<SharedGroupLayer&>(module).RunChild(i, inputs);
                        })
                        .WithName(type)
                        .WithParameterCount(CountTrainableParameters(*shared)));
  }
  return specs;
}

}  // namespace pp
