#include "pipeline/autograd/split_backward.h"

#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include "common/torch_compat.h"

namespace pp {
namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Engine;
using torch::autograd::Node;

// The graph below `roots`, walked once: every node reachable from them, and
// for each whether one of `targets` can be reached from it (the input
// closure) and whether it is a join node (in the closure, not a target, with
// an edge to a node outside the closure). A stage's graph has a few hundred
// nodes and this runs once per micro-batch: two hash lookups per edge, the
// rest in vectors indexed by the order of discovery.
class InputClosure {
 public:
  InputClosure(const edge_list& roots, const std::vector<Node*>& targets) {
    index_.reserve(512);
    nodes_.reserve(512);
    for (Node* target : targets) {
      // Targets are leaves' AccumulateGrad nodes: nothing below them.
      if (Add(target)) reaches_.back() = 1;
    }
    // Iterative post-order: a stage's graph is a chain thousands of nodes long.
    std::vector<std::pair<size_t, size_t>> stack;  // (node index, next edge)
    for (const Edge& root : roots) {
      Node* start = root.function.get();
      if (start == nullptr || !Add(start)) continue;
      stack.emplace_back(nodes_.size() - 1, 0);
      while (!stack.empty()) {
        const size_t node = stack.back().first;
        const edge_list& edges = nodes_[node]->next_edges();
        size_t& next = stack.back().second;
        while (next < edges.size()) {
          Node* child = edges[next++].function.get();
          if (child != nullptr && Add(child)) {
            stack.emplace_back(nodes_.size() - 1, 0);
            break;
          }
        }
        if (stack.back().first != node) continue;
        // All children are done (the graph is acyclic).
        stack.pop_back();
        bool reaches = false, leaves = false;
        for (const Edge& edge : edges) {
          if (edge.function == nullptr) continue;
          if (Reaches(edge)) {
            reaches = true;
          } else {
            leaves = true;
          }
        }
        reaches_[node] = reaches;
        if (reaches && leaves) joins_.push_back(nodes_[node]);
      }
    }
  }

  bool Reaches(const Edge& edge) const {
    auto it = index_.find(edge.function.get());
    return it != index_.end() && reaches_[it->second];
  }
  // In post-order: a join node after every join node below it.
  const std::vector<Node*>& joins() const { return joins_; }

 private:
  // Records a newly found node; false if it was known.
  bool Add(Node* node) {
    if (!index_.emplace(node, nodes_.size()).second) return false;
    nodes_.push_back(node);
    reaches_.push_back(0);
    return true;
  }

  std::unordered_map<Node*, size_t> index_;
  std::vector<Node*> nodes_;
  std::vector<char> reaches_;
  std::vector<Node*> joins_;
};

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
  BackwardInputResult result;
  if (inputs.empty()) {
    // No input gradient wanted: all of the backward is W's, no graph walk.
    result.weight.roots_ = std::move(root_edges);
    result.weight.grads_ = std::move(grads);
    return result;
  }
  edge_list input_edges;
  std::vector<Node*> targets;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(inputs[i].requires_grad(), "BackwardInput: input ", i,
                " does not require grad; pass only the inputs whose gradient is wanted");
    input_edges.push_back(torch::autograd::impl::gradient_edge(inputs[i]));
    targets.push_back(input_edges.back().function.get());
  }
  const InputClosure closure(root_edges, targets);

  result.input_grads.resize(inputs.size());
  // Roots that reach no input belong to W as they are.
  edge_list input_roots;
  std::vector<torch::Tensor> input_root_grads;
  for (size_t i = 0; i < root_edges.size(); ++i) {
    if (closure.Reaches(root_edges[i])) {
      input_roots.push_back(root_edges[i]);
      input_root_grads.push_back(grads[i]);
    } else {
      result.weight.roots_.push_back(root_edges[i]);
      result.weight.grads_.push_back(grads[i]);
    }
  }
  if (input_roots.empty()) return result;

  const std::vector<Node*>& joins = closure.joins();
  edge_list outputs = input_edges;
  std::vector<std::pair<size_t, Edge>> captures;  // (index into outputs, edge)
  for (Node* join : joins) {
    // The edge objects must own the node: the closure holds raw pointers.
    for (uint32_t k = 0; k < join->num_inputs(); ++k) {
      captures.emplace_back(outputs.size(), torch_compat::OwningEdge(join, k));
      outputs.push_back(captures.back().second);
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
      if (edge.function != nullptr && closure.Reaches(edge)) edge = Edge();
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
