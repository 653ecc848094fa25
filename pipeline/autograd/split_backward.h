// Split backward for zero-bubble schedules: `I` (gradients for a stage's
// inputs, sent upstream at once) and `W` (the parameter gradients, later),
// with no part of the backward computed twice.
//
// How: the autograd graph of one micro-batch is cut where the weight path
// joins the input path (PyTorch's torch/distributed/pipelining/
// _backward.py does the same with pre-hooks). BackwardInput
//   1. marks the input closure: the graph nodes from which a stage input can
//      be reached;
//   2. calls a node of that closure with an edge leaving it (towards a
//      parameter) a join node; the engine runs the input-gradient pass with
//      the stage inputs *and* the join nodes' incoming gradients as outputs,
//      so it captures what flows into each join node while the join node
//      itself (an Addmm, a LayerNorm, a checkpointed range...) computes only
//      its input-side outputs (task_should_compute_output is false for the
//      weight edges it was not asked for);
//   3. cuts the join nodes' edges into the input closure, so that re-running
//      a join node later can reach nothing on the input side.
// WeightGradTask::Run then starts the engine at the join nodes with the
// captured gradients: each join node computes only its weight-side outputs,
// and the weight-only subgraphs (transposes, AccumulateGrad) run once.
// What runs twice is the join node's call, each time for disjoint outputs,
// which is the split itself; nothing on the input path runs in W.
//
// We chose this over DualPipe's queued weight-gradient closures because the
// closures need every layer to be written with custom autograd functions
// that defer their weight matmul; cutting the graph works for any module a
// LayerSpec builds, tied layers included (a parameter used twice gets both
// contributions in W, as in B), and activation checkpointing cooperates
// (pipeline/autograd/recompute.cc keeps the recomputed range's own
// WeightGradTask from I to W, so a range is recomputed once).
//
// Memory between I and W: the join nodes and their saved tensors (for a
// Linear, its input activation; for a LayerNorm, input, mean and rstd), the
// weight-only subgraphs, the captured gradients at the join nodes, and the
// stage inputs when a join node saved them. Everything else of the graph
// (element-wise nodes, attention's softmax, ...) is freed when I drops the
// outputs. The simulator's memory model (pipeline/schedule/analysis/simulator.h)
// charges this as the part W frees.
//
// Errors are LibTorch's (c10::Error), like torch::autograd::backward: call
// these where a step turns exceptions into Status.
#ifndef PIPELINE_AUTOGRAD_SPLIT_BACKWARD_H_
#define PIPELINE_AUTOGRAD_SPLIT_BACKWARD_H_

#include <vector>

#include <torch/torch.h>

namespace pp {

struct BackwardInputResult;

// What the input-gradient pass kept for the weight-gradient pass of one
// graph. Movable, not copyable; Run at most once. Dropping it without Run
// frees the kept graph (the weight gradients are then never computed).
class WeightGradTask {
 public:
  WeightGradTask() = default;
  WeightGradTask(WeightGradTask&&) = default;
  WeightGradTask& operator=(WeightGradTask&&) = default;
  WeightGradTask(const WeightGradTask&) = delete;
  WeightGradTask& operator=(const WeightGradTask&) = delete;

  // True when there is nothing left to compute (no parameter on the graph,
  // or already run).
  bool empty() const { return roots_.empty(); }

  // Computes the weight gradients and accumulates them into the leaves'
  // .grad, as torch::autograd::backward would. Frees the kept graph.
  void Run();

  // Computes the gradients of `targets` (leaves of the weight path) and
  // returns them instead of accumulating (undefined where none flows).
  // Frees the kept graph.
  std::vector<torch::Tensor> Run(const std::vector<torch::Tensor>& targets);

 private:
  friend BackwardInputResult BackwardInput(const std::vector<torch::Tensor>&,
                                           const std::vector<torch::Tensor>&,
                                           const std::vector<torch::Tensor>&);
  torch::autograd::edge_list roots_;
  std::vector<torch::Tensor> grads_;
};

struct BackwardInputResult {
  // The gradient of each of `inputs` (undefined where none flows).
  std::vector<torch::Tensor> input_grads;
  // The rest of the backward, for later.
  WeightGradTask weight;
};

// The input half of torch::autograd::backward(roots, root_grads): returns the
// gradients of `inputs` (not accumulated into .grad) and the weight half.
// An undefined root gradient means ones (a scalar loss). Inputs that do not
// require grad are an error. With no inputs, all of the backward is left to
// the weight half.
BackwardInputResult BackwardInput(const std::vector<torch::Tensor>& roots,
                                  const std::vector<torch::Tensor>& root_grads,
                                  const std::vector<torch::Tensor>& inputs);

}  // namespace pp

#endif  // PIPELINE_AUTOGRAD_SPLIT_BACKWARD_H_
