#include "models/test_util.h"

#include <map>
#include <set>
#include <string>

namespace pp {

std::vector<torch::Tensor> LocalModel::Parameters() const {
  std::vector<torch::Tensor> params;
  std::set<const void*> seen;
  for (const std::vector<Layer>* list : {&layers, &shared}) {
    for (const Layer& layer : *list) {
      for (const torch::Tensor& p : layer->parameters()) {
        if (seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
      }
    }
  }
  return params;
}

LocalModel BuildLocalModel(const std::vector<LayerSpec>& specs, uint64_t seed) {
  LocalModel model;
  std::map<std::string, Layer> tied;
  for (size_t i = 0; i < specs.size(); ++i) {
    const LayerSpec& spec = specs[i];
    if (!spec.is_tied()) {
      model.layers.push_back(BuildSeeded(seed + i, spec.factory()));
      continue;
    }
    auto it = tied.find(spec.tie_key());
    if (it == tied.end()) {
      it = tied.emplace(spec.tie_key(), BuildSeeded(seed + i, spec.factory())).first;
      model.shared.push_back(it->second);
    }
    model.layers.push_back(
        std::make_shared<TiedLayer>(spec.name(), spec.tie_key(), it->second, spec.tied_forward_fn()));
  }
  return model;
}

}  // namespace pp
