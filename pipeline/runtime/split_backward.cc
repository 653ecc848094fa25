#include "pipeline/runtime/split_backward.h"

#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

namespace pp {
namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Engine;
using torch::autograd::Node;

// For every node reachable from `roots`: whether one of `targets` can be
// reached from it (the input closure). Iterative post-order: a stage's graph
// is a chain thousands of nodes long.
std::unordered_map<Node*, bool> InputClosure(const edge_list& roots,
                                             const std::unordered_set<Node*>& targets) {
  std::unordered_map<Node*, bool> reaches;
  std::vector<std::pair<Node*, size_t>> stack;
  for (const Edge& root : roots) {
    Node* start = root.function.get();
    if (start == nullptr || reaches.count(start) > 0) continue;
    reaches[start] = targets.count(start) > 0;
    stack.emplace_back(start, 0);
    while (!stack.empty()) {
      Node* node = stack.back().first;
      const size_t next = stack.back().second;
      if (next < node->next_edges().size()) {
        stack.back().second += 1;
        Node* child = node->next_edges()[next].function.get();
        if (child != nullptr && reaches.count(child) == 0) {
          reaches[child] = targets.count(child) > 0;
          // Targets are leaves' AccumulateGrad nodes: nothing below them.
          if (!reaches[child]) stack.emplace_back(child, 0);
        }
        continue;
      }
      stack.pop_back();
      bool& mine = reaches[node];
      for (const Edge& edge : node->next_edges()) {
        if (edge.function != nullptr && reaches.at(edge.function.get())) mine = true;
      }
    }
  }
  return reaches;
}

}  // namespace

BackwardInputResult BackwardInput(const std::vector<torch::Tensor>& roots,
                                  const std::vector<torch::Tensor>& root_grads,
                                  const std::vector<torch::Tensor>& inputs) {
  TORCH_CHECK(roots.size() == root_grads.size(), "BackwardInput: ", roots.size(), " roots but ",
              root_grads.size(), " root gradients");
  edge_list root_edges;
  std::vector<torch::Tensor> grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    TORCH_CHECK(roots[i].requires_grad(), "BackwardInput: root ", i, " does not require grad");
    root_edges.push_back(torch::autograd::impl::gradient_edge(roots[i]));
    grads.push_back(root_grads[i].defined() ? root_grads[i] : torch::ones_like(roots[i]));
  }
  edge_list input_edges;
  std::unordered_set<Node*> targets;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(inputs[i].requires_grad(), "BackwardInput: input ", i,
                " does not require grad; pass only the inputs whose gradient is wanted");
    input_edges.push_back(torch::autograd::impl::gradient_edge(inputs[i]));
    targets.insert(input_edges.back().function.get());
  }
  const std::unordered_map<Node*, bool> reaches = InputClosure(root_edges, targets);
  auto in_closure = [&](const Edge& e) {
    auto it = reaches.find(e.function.get());
    return it != reaches.end() && it->second;
  };

  BackwardInputResult result;
  result.input_grads.resize(inputs.size());
  // Roots that reach no input belong to W as they are.
  edge_list input_roots;
  std::vector<torch::Tensor> input_root_grads;
  for (size_t i = 0; i < root_edges.size(); ++i) {
    if (in_closure(root_edges[i])) {
      input_roots.push_back(root_edges[i]);
      input_root_grads.push_back(grads[i]);
    } else {
      result.weight.roots_.push_back(root_edges[i]);
      result.weight.grads_.push_back(grads[i]);
    }
  }
  if (input_roots.empty()) return result;

  // Join nodes: in the closure, not a target, with an edge leaving it.
  std::vector<Node*> joins;
  for (const auto& [node, reach] : reaches) {
    if (!reach || targets.count(node) > 0) continue;
    for (const Edge& edge : node->next_edges()) {
      if (edge.function != nullptr && !in_closure(edge)) {
        joins.push_back(node);
        break;
      }
    }
  }
  edge_list outputs = input_edges;
  std::vector<std::pair<size_t, Edge>> captures;  // (index into outputs, edge)
  for (Node* join : joins) {
    // The edge objects must own the node: reaches holds raw pointers only.
    std::shared_ptr<Node> owner = join->shared_from_this();
    for (uint32_t k = 0; k < join->num_inputs(); ++k) {
      captures.emplace_back(outputs.size(), Edge(owner, k));
      outputs.push_back(Edge(owner, k));
    }
  }
  // Join nodes run again in W: keep their saved tensors.
  const bool keep_graph = !joins.empty();
  std::vector<torch::Tensor> out =
      Engine::get_default_engine().execute(input_roots, input_root_grads, keep_graph,
                                           /*create_graph=*/false,
                                           /*accumulate_grad=*/false, outputs);
  for (size_t i = 0; i < inputs.size(); ++i) result.input_grads[i] = out[i];
  for (const auto& [index, edge] : captures) {
    if (!out[index].defined()) continue;
    result.weight.roots_.push_back(edge);
    result.weight.grads_.push_back(out[index]);
  }
  // Cut: from here on a join node reaches the weight side only. Written
  // through next_edges() rather than set_next_edge, which refuses nodes that
  // already have a parent (topological numbers only shrink by a cut).
  for (Node* join : joins) {
    for (Edge& edge : join->next_edges()) {
      if (edge.function != nullptr && in_closure(edge)) edge = Edge();
    }
  }
  return result;
}

void WeightGradTask::Run() {
  if (roots_.empty()) return;
  edge_list roots = std::move(roots_);
  std::vector<torch::Tensor> grads = std::move(grads_);
  roots_.clear();
  grads_.clear();
  Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false,
                                       /*create_graph=*/false, /*accumulate_grad=*/true);
}

std::vector<torch::Tensor> WeightGradTask::Run(const std::vector<torch::Tensor>& targets) {
  std::vector<torch::Tensor> result(targets.size());
  if (roots_.empty() || targets.empty()) {
    roots_.clear();
    grads_.clear();
    return result;
  }
  edge_list roots = std::move(roots_);
  std::vector<torch::Tensor> grads = std::move(grads_);
  roots_.clear();
  grads_.clear();
  edge_list outputs;
  for (const torch::Tensor& t : targets) {
    TORCH_CHECK(t.requires_grad(), "WeightGradTask::Run: a target does not require grad");
    outputs.push_back(torch::autograd::impl::gradient_edge(t));
  }
  return Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false,
                                              /*create_graph=*/false,
                                              /*accumulate_grad=*/false, outputs);
}

}  // namespace pp
