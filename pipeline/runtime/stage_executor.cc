#include "pipeline/runtime/stage_executor.h"

#include <algorithm>
#include <deque>
#include <set>
#include <string>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "pipeline/tensor_parallel/mappings.h"
#include "pipeline/tensor_parallel/planted_fault.h"
#include "topology/wait_work.h"

namespace pp {
namespace {

// What the next stage on the same rank receives: the outputs cut from this
// stage's graph (so each stage's backward stays its own), with the same
// requires-grad flags a p2p transfer would carry.
Activations HandOver(const Activations& outputs) {
  Activations inputs;
  inputs.reserve(outputs.size());
  for (const torch::Tensor& t : outputs) {
    torch::Tensor d = t.detach();
    if (t.is_floating_point() && t.requires_grad()) d.requires_grad_(true);
    inputs.push_back(d);
  }
  return inputs;
}

std::string Name(const Action& a) { return ActionToString(a); }

// Each token's weight in a micro-batch's loss under vocabulary parallelism,
// as the dense loss reduces its per-token losses (ReduceTokenLosses): 1/n
// over the n counted tokens (labels not ignored), or with per-token loss the
// mask (the step divides by the global batch's trained tokens).
torch::Tensor VocabTokenWeights(const MicroBatchData& data, const std::string& labels_key,
                                int64_t ignore_index) {
  const torch::Tensor counted = (data.batch.Get(labels_key) != ignore_index).to(torch::kFloat32);
  if (data.global_loss_tokens > 0) {
    return counted * data.batch.Get(kLossMaskKey).to(torch::kFloat32);
  }
  return counted / std::max(counted.sum().item<double>(), 1.0);
}

}  // namespace

StageExecutor::StageExecutor(
    int rank,
    std::map<int, std::function<Activations(const Activations&, const MicroBatch&)>> stages,
    LossFn loss_fn, MicroBatchSource* source, c10::intrusive_ptr<c10d::ProcessGroup> pipe_group,
    StageExecutorOptions options)
    : rank_(rank),
      stages_(std::move(stages)),
      loss_fn_(std::move(loss_fn)),
      source_(source),
      pipe_group_(pipe_group),
      options_(std::move(options)),
      p2p_(pipe_group, options_.p2p) {}

bool StageExecutor::IsLocal(const StepState& st, int stage) const {
  return stage >= 0 && stage < static_cast<int>(st.program->stage_to_rank.size()) &&
         st.program->stage_to_rank[stage] == rank_;
}

RuntimeCapabilities StageExecutorCapabilities() {
  RuntimeCapabilities capabilities;
  capabilities.split_backward = true;
  capabilities.overlap_f_b = true;  // its halves run back to back (Run)
  // vocab_parallel: only with VocabularyLayers (set_vocabulary; a run with
  // parallelism.vocab_parallel gives them), so not by default.
  return capabilities;
}

absl::Status StageExecutor::Validate(const LoweredProgram& program) const {
  if (rank_ < 0 || rank_ >= static_cast<int>(program.ranks.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank_, " has no program: the schedule has ", program.ranks.size(), " ranks"));
  }
  if (pipe_group_ && pipe_group_->getSize() != program.num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule '", program.schedule_name, "' is for ", program.num_stages,
                     " pipeline ranks but the pipe group has ", pipe_group_->getSize()));
  }
  const int num_virtual = program.num_virtual_stages();
  for (int s = 0; s < num_virtual; ++s) {
    const bool local = program.stage_to_rank[s] == rank_;
    if (local != (stages_.count(s) > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule '", program.schedule_name, "' places virtual stage ", s, " on rank ",
          program.stage_to_rank[s], " but rank ", rank_,
          (local ? " has no module for it" : " holds its module"),
          "; the model must be partitioned into num_stages * num_chunks = ", num_virtual,
          " parts"));
    }
  }
  RuntimeCapabilities capabilities = StageExecutorCapabilities();
  capabilities.vocab_parallel = vocab_ != nullptr;
  PP_RETURN_IF_ERROR(CheckRuntimeSupports(program, capabilities));
  if (program.vocab_parallel && vocab_->num_stages() != program.num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the vocabulary is split over ", vocab_->num_stages(), " stages (", vocab_->group().size,
        " ranks) but schedule '", program.schedule_name, "' has ", program.num_stages));
  }
  for (const Action& action : program.ranks[rank_]) {
    for (const Action& leaf : Leaves(action)) {
      if (HasStage(leaf.type) && !IsTail(leaf.type) && stages_.count(leaf.stage) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("action ", Name(action), " of rank ", rank_,
                         " is for a virtual stage this rank does not hold"));
      }
    }
    const Action& a = action;
    if (a.type == ActionType::kReduceGrads && stages_.count(a.stage) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("action ", Name(a), " of rank ", rank_,
                       " is for a virtual stage this rank does not hold"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const MicroBatchData*> StageExecutor::Data(StepState& st, int mb) {
  auto it = st.data.find(mb);
  if (it != st.data.end()) return &it->second;
  const int64_t index =
      static_cast<int64_t>(options_.data_parallel_id) * st.program->num_microbatches + mb;
  PP_ASSIGN_OR_RETURN(MicroBatchData data, st.source->Get(st.step, index));
  // Per-token loss: every micro-batch of the step names the same global
  // token count, and carries a mask exactly when it names one.
  const bool masked = data.batch.Has(kLossMaskKey);
  if (masked != (data.global_loss_tokens > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batch ", index, " of step ", st.step, masked ? " carries" : " does not carry",
        " a \"", kLossMaskKey, "\" but names global_loss_tokens = ", data.global_loss_tokens,
        "; a source with per-token loss sets both (the mask and the global batch's trained "
        "tokens, > 0), one without sets neither (micro_batch_source.h)"));
  }
  if (st.stats.global_loss_tokens != 0 && data.global_loss_tokens != st.stats.global_loss_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batch ", index, " of step ", st.step, " says the global batch trains on ",
        data.global_loss_tokens, " tokens, an earlier micro-batch of the step said ",
        st.stats.global_loss_tokens, "; every micro-batch of a step must name the same count"));
  }
  st.stats.global_loss_tokens = data.global_loss_tokens;
  return &st.data.emplace(mb, std::move(data)).first->second;
}

// The only place the loss is scaled, once, on the last stage: by 1/m (mean
// of micro-batches), or, with per-token loss, by dp / global_loss_tokens so
// that the data-parallel average leaves sum / global_loss_tokens.
torch::Tensor StageExecutor::ScaledLoss(const torch::Tensor& loss, const MicroBatchData& data,
                                        int num_microbatches) const {
  if (data.global_loss_tokens == 0) return loss / static_cast<double>(num_microbatches);
  if (options_.loss_normalization_fault == LossNormalizationFault::kMicroBatchMean) {
    const double own = data.batch.Get(kLossMaskKey).sum().item<double>();
    return loss / (std::max(own, 1.0) * num_microbatches);
  }
  return loss * (static_cast<double>(options_.data_parallel_size) /
                 static_cast<double>(data.global_loss_tokens));
}

absl::Status StageExecutor::Forward(const Action& a, StepState& st) {
  const int s = a.stage;
  const int mb = a.microbatch;
  const Key key{s, mb};
  const int last = st.program->num_virtual_stages() - 1;
  PP_ASSIGN_OR_RETURN(const MicroBatchData* data, Data(st, mb));
  Activations inputs;
  bool received = false;
  int64_t id = data->batch.id;
  const bool vocab = st.program->vocab_parallel;
  if (s == 0 && vocab) {
    PP_RETURN_IF_ERROR(FinishVocabCollective(st, ActionType::kVocabInputReduce, mb));
    auto it = st.vocab_embedded.find(mb);
    if (it == st.vocab_embedded.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(Name(a), " on rank ", rank_, ": F of stage 0 before its IN_REDUCE"));
    }
    inputs = {it->second};
    st.vocab_embedded.erase(it);
  } else if (s == 0) {
    inputs = data->inputs;
  } else {
    auto it = st.inbox.find(key);
    if (it == st.inbox.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          Name(a), " on rank ", rank_,
          ": no input received for this micro-batch (the program runs F before its RECV_F)"));
    }
    inputs = std::move(it->second.first);
    received = it->second.second;
    st.inbox.erase(it);
    auto id_it = st.inbox_ids.find(key);
    if (id_it != st.inbox_ids.end()) {
      if (id_it->second >= 0) id = id_it->second;
      st.inbox_ids.erase(id_it);
    }
  }
  Activations outputs = stages_.at(s)(inputs, data->batch);
  if (s == last && id != data->batch.id) {
    return absl::InternalError(
        absl::StrCat(Name(a), " on rank ", rank_, ": activations belong to micro-batch id ", id,
                     " but the labels to id ", data->batch.id,
                     "; refusing to compute a loss from mismatched batches"));
  }
  if (s == last && !vocab) {
    torch::Tensor loss = loss_fn_(outputs, data->batch);
    if (loss.numel() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("the loss function returned ", loss.numel(),
                                                     " elements; it must return a scalar"));
    }
    st.stats.loss_sum += loss.detach().item<double>();
    st.stats.losses_computed += 1;
    if (!st.forward_only) {
      StashEntry entry;
      entry.inputs = std::move(inputs);
      entry.received = received;
      entry.loss = ScaledLoss(loss, *data, st.program->num_microbatches);
      if (options_.loss_normalization_fault == LossNormalizationFault::kDroppedMicroBatch &&
          mb == st.program->num_microbatches - 1) {
        entry.loss = entry.loss * 0.0;
      }
      st.stash[key] = std::move(entry);
    } else if (received) {
      p2p_.Recycle(std::move(inputs));
    }
    return absl::OkStatus();
  }
  if (s == last) {
    // Vocabulary parallelism: the head reads this stage's output (OUT_BCAST).
    if (outputs.size() != 1 || !outputs[0].is_floating_point()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Name(a),
                       ": with vocabulary parallelism the last stage returns one "
                       "floating tensor (the hidden states the head reads), got ",
                       outputs.size(), " tensors"));
    }
    st.vocab_hidden[mb] = outputs[0].detach().to(vocab_->head().scalar_type()).contiguous();
  } else if (IsLocal(st, s + 1)) {
    st.inbox[{s + 1, mb}] = {HandOver(outputs), false};
    st.inbox_ids[{s + 1, mb}] = id;
  } else {
    st.outbox[key] = outputs;
    st.outbox_ids[key] = id;
  }
  if (!st.forward_only) {
    if (s != last) st.out_layouts[key] = LayoutOf(outputs);
    StashEntry entry;
    entry.inputs = std::move(inputs);
    entry.outputs = std::move(outputs);
    entry.received = received;
    st.stash[key] = std::move(entry);
  } else if (received) {
    // Under no-grad the outputs hold no reference to the inputs unless a layer
    // returned them as they are; Recycle checks that.
    p2p_.Recycle(std::move(inputs));
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::Roots(const Action& a, StepState& st, StashEntry& entry,
                                  std::vector<torch::Tensor>& roots,
                                  std::vector<torch::Tensor>& root_grads, Activations& grads,
                                  bool& grads_received) {
  const Key key{a.stage, a.microbatch};
  grads_received = false;
  const bool last = a.stage == st.program->num_virtual_stages() - 1;
  if (last && st.program->vocab_parallel) {
    PP_RETURN_IF_ERROR(FinishVocabCollective(st, ActionType::kVocabOutputReduce, a.microbatch));
    auto g = st.vocab_hidden_grad.find(a.microbatch);
    if (g == st.vocab_hidden_grad.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(Name(a), " on rank ", rank_, ": the last stage's backward before its ",
                       "OUT_REDUCE (no gradient of the head's input)"));
    }
    for (const torch::Tensor& out : entry.outputs) {
      if (!(out.is_floating_point() && out.requires_grad())) continue;
      roots.push_back(out);
      root_grads.push_back(g->second.to(out.scalar_type()));
    }
    st.vocab_hidden_grad.erase(g);
    return absl::OkStatus();
  }
  if (last) {
    roots.push_back(entry.loss);
    root_grads.push_back(torch::ones_like(entry.loss));
    return absl::OkStatus();
  }
  auto g = st.grad_inbox.find(key);
  if (g == st.grad_inbox.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Name(a), " on rank ", rank_, ": no output gradient (", Name(a), " before its RECV_B)"));
  }
  grads = std::move(g->second.first);
  grads_received = g->second.second;
  st.grad_inbox.erase(g);
  size_t next = 0;
  for (const torch::Tensor& out : entry.outputs) {
    if (!(out.is_floating_point() && out.requires_grad())) continue;
    if (next >= grads.size()) {
      return absl::InternalError(absl::StrCat(Name(a), ": fewer output gradients (", grads.size(),
                                              ") than outputs that require grad"));
    }
    roots.push_back(out);
    root_grads.push_back(grads[next++]);
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::KeepEmbeddingGrad(const Action& a, StepState& st,
                                              Activations input_grads) {
  if (input_grads.size() != 1) {
    return absl::InternalError(absl::StrCat(Name(a), ": stage 0 has ", input_grads.size(),
                                            " input gradients; the embedding gives it one input"));
  }
  st.vocab_input_grad[a.microbatch] = input_grads[0].contiguous();
  return absl::OkStatus();
}

void StageExecutor::HandInputGrads(StepState& st, int stage, int mb, Activations input_grads) {
  if (IsLocal(st, stage - 1)) {
    st.grad_inbox[{stage - 1, mb}] = {std::move(input_grads), false};
  } else {
    st.grad_outbox[{stage, mb}] = std::move(input_grads);
  }
}

absl::StatusOr<std::map<StageExecutor::Key, StageExecutor::StashEntry>::iterator>
StageExecutor::StashBeforeInputGrads(const Action& a, StepState& st, const char* what) {
  auto it = st.stash.find(Key{a.stage, a.microbatch});
  if (it == st.stash.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Name(a), " on rank ", rank_, ": nothing stashed (",
                     a.type == ActionType::kBackward ? "B" : "I", " before its F)"));
  }
  if (it->second.input_grads_done) {
    return absl::FailedPreconditionError(
        absl::StrCat(Name(a), " on rank ", rank_, ": ", what, " after this micro-batch's I"));
  }
  return it;
}

absl::Status StageExecutor::Backward(const Action& a, StepState& st) {
  const int s = a.stage;
  const int mb = a.microbatch;
  const Key key{s, mb};
  PP_ASSIGN_OR_RETURN(auto it, StashBeforeInputGrads(a, st, "full B"));
  StashEntry entry = std::move(it->second);
  st.stash.erase(it);
  std::vector<torch::Tensor> roots, root_grads;
  Activations grads;
  bool grads_received = false;
  PP_RETURN_IF_ERROR(Roots(a, st, entry, roots, root_grads, grads, grads_received));
  if (!roots.empty()) torch::autograd::backward(roots, root_grads);
  roots.clear();
  root_grads.clear();
  entry.outputs.clear();
  entry.loss = torch::Tensor();
  if (grads_received) p2p_.Recycle(std::move(grads));
  st.out_layouts.erase(key);
  if (s > 0 || st.program->vocab_parallel) {
    Activations input_grads;
    for (const torch::Tensor& in : entry.inputs) {
      if (!(in.is_floating_point() && in.requires_grad())) continue;
      torch::Tensor g = in.grad();
      input_grads.push_back(g.defined() ? g : torch::zeros_like(in));
    }
    if (s > 0) {
      HandInputGrads(st, s, mb, std::move(input_grads));
    } else {
      PP_RETURN_IF_ERROR(KeepEmbeddingGrad(a, st, std::move(input_grads)));
    }
  }
  if (entry.received) {
    for (torch::Tensor& in : entry.inputs) {
      if (in.requires_grad()) in.mutable_grad().reset();
      in.requires_grad_(false);
    }
    p2p_.Recycle(std::move(entry.inputs));
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::BackwardInput(const Action& a, StepState& st) {
  const int s = a.stage;
  const int mb = a.microbatch;
  const Key key{s, mb};
  PP_ASSIGN_OR_RETURN(auto it, StashBeforeInputGrads(a, st, "a second I"));
  StashEntry& entry = it->second;
  std::vector<torch::Tensor> roots, root_grads;
  bool grads_received = false;
  Activations grads;
  PP_RETURN_IF_ERROR(Roots(a, st, entry, roots, root_grads, grads, grads_received));
  std::vector<torch::Tensor> wanted;
  for (const torch::Tensor& in : entry.inputs) {
    if (in.is_floating_point() && in.requires_grad()) wanted.push_back(in);
  }
  Activations input_grads;
  if (!roots.empty()) {
    BackwardInputResult result = pp::BackwardInput(roots, root_grads, wanted);
    input_grads = std::move(result.input_grads);
    entry.weight = std::move(result.weight);
  } else {
    input_grads.resize(wanted.size());
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (!input_grads[i].defined()) input_grads[i] = torch::zeros_like(wanted[i]);
  }
  // The outputs' graph is no longer needed except where W's join nodes hold it.
  roots.clear();
  root_grads.clear();
  entry.outputs.clear();
  entry.loss = torch::Tensor();
  entry.input_grads_done = true;
  // A root that reaches no input keeps its gradient in the weight task: the
  // received buffers are recycled only after W.
  if (grads_received) entry.output_grads = std::move(grads);
  st.out_layouts.erase(key);
  if (s > 0) {
    HandInputGrads(st, s, mb, std::move(input_grads));
  } else if (st.program->vocab_parallel) {
    PP_RETURN_IF_ERROR(KeepEmbeddingGrad(a, st, std::move(input_grads)));
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::BackwardWeight(const Action& a, StepState& st) {
  const Key key{a.stage, a.microbatch};
  auto it = st.stash.find(key);
  if (it == st.stash.end() || !it->second.input_grads_done) {
    return absl::FailedPreconditionError(
        absl::StrCat(Name(a), " on rank ", rank_, ": W before this micro-batch's I"));
  }
  StashEntry entry = std::move(it->second);
  st.stash.erase(it);
  entry.weight.Run();
  if (!entry.output_grads.empty()) p2p_.Recycle(std::move(entry.output_grads));
  if (entry.received) {
    for (torch::Tensor& in : entry.inputs) in.requires_grad_(false);
    p2p_.Recycle(std::move(entry.inputs));
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::PostReady(StepState& st, std::map<ChannelId, Channel>& channels) {
  const LoweredProgram& program = *st.program;
  for (auto& [id, channel] : channels) {
    if (channel.posted || channel.receives.empty()) continue;
    const Action& a = channel.receives.front();
    const std::string what = absl::StrCat(Name(a), " on rank ", rank_);
    if (a.type == ActionType::kRecvForward) {
      PP_RETURN_IF_ERROR(p2p_.PostRecvActivations(program.PeerRank(a), a.stage - 1, a.stage, what));
    } else {
      // The layout of the gradients is that of the F outputs: not before F.
      auto layout = st.out_layouts.find(Key{a.stage, a.microbatch});
      if (layout == st.out_layouts.end()) continue;
      PP_RETURN_IF_ERROR(
          p2p_.PostRecvGrads(program.PeerRank(a), a.stage, a.stage + 1, layout->second, what));
    }
    channel.receives.pop_front();
    channel.posted = true;
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::Execute(const Action& a, StepState& st, const TailFn& tail) {
  const LoweredProgram& program = *st.program;
  const Key key{a.stage, a.microbatch};
  switch (a.type) {
    case ActionType::kForward:
      return Forward(a, st);
    case ActionType::kBackward:
      if (st.forward_only)
        return absl::InvalidArgumentError(absl::StrCat(Name(a), " in a forward-only program"));
      PP_RETURN_IF_ERROR(Backward(a, st));
      if (after_backward_) after_backward_();
      return absl::OkStatus();
    case ActionType::kRecvForward: {
      int64_t id = -1;
      PP_ASSIGN_OR_RETURN(Activations acts,
                          p2p_.RecvActivations(program.PeerRank(a), a.stage - 1, a.stage,
                                               absl::StrCat(Name(a), " on rank ", rank_), &id));
      if (st.forward_only) {
        for (torch::Tensor& t : acts) t.requires_grad_(false);
      }
      st.inbox[key] = {std::move(acts), true};
      st.inbox_ids[key] = id;
      return absl::OkStatus();
    }
    case ActionType::kSendForward: {
      auto it = st.outbox.find(key);
      if (it == st.outbox.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(Name(a), " on rank ", rank_, ": no output to send (SEND_F before F)"));
      }
      const int64_t id = st.outbox_ids[key];
      absl::Status s = p2p_.SendActivations(program.PeerRank(a), a.stage, a.stage + 1, it->second,
                                            absl::StrCat(Name(a), " on rank ", rank_), id);
      st.outbox.erase(it);
      st.outbox_ids.erase(key);
      return s;
    }
    case ActionType::kRecvBackward: {
      auto layout = st.out_layouts.find(key);
      if (layout == st.out_layouts.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(Name(a), " on rank ", rank_, ": RECV_B before F"));
      }
      PP_ASSIGN_OR_RETURN(Activations grads,
                          p2p_.RecvGrads(program.PeerRank(a), a.stage, a.stage + 1, layout->second,
                                         absl::StrCat(Name(a), " on rank ", rank_)));
      st.grad_inbox[key] = {std::move(grads), true};
      return absl::OkStatus();
    }
    case ActionType::kSendBackward: {
      auto it = st.grad_outbox.find(key);
      if (it == st.grad_outbox.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(Name(a), " on rank ", rank_, ": SEND_B before B"));
      }
      absl::Status s = p2p_.SendGrads(program.PeerRank(a), a.stage - 1, a.stage, it->second,
                                      absl::StrCat(Name(a), " on rank ", rank_));
      st.grad_outbox.erase(it);
      return s;
    }
    case ActionType::kReduceTiedGrads:
    case ActionType::kReduceGrads:
    case ActionType::kOptimizerStep:
      // Sends and vocabulary collectives still in flight must complete
      // before the tail's collectives and before the optimizer reads the
      // gradients and changes weights a later step depends on.
      PP_RETURN_IF_ERROR(FinishVocabCollectives(st));
      PP_RETURN_IF_ERROR(p2p_.WaitSends());
      return tail ? tail(a) : absl::OkStatus();
    case ActionType::kBackwardInput:
      if (st.forward_only)
        return absl::InvalidArgumentError(absl::StrCat(Name(a), " in a forward-only program"));
      PP_RETURN_IF_ERROR(BackwardInput(a, st));
      if (after_backward_) after_backward_();
      return absl::OkStatus();
    case ActionType::kBackwardWeight:
      if (st.forward_only)
        return absl::InvalidArgumentError(absl::StrCat(Name(a), " in a forward-only program"));
      PP_RETURN_IF_ERROR(BackwardWeight(a, st));
      if (after_backward_) after_backward_();
      return absl::OkStatus();
    case ActionType::kOverlapFB:
      // Run() executes the halves one by one (each observed on its own).
      for (const Action& half : Leaves(a)) PP_RETURN_IF_ERROR(Execute(half, st, tail));
      return absl::OkStatus();
    case ActionType::kVocabOutputS:
    case ActionType::kVocabOutputT:
    case ActionType::kVocabInputF:
    case ActionType::kVocabInputB:
    case ActionType::kVocabOutputBroadcast:
    case ActionType::kVocabOutputStats:
    case ActionType::kVocabOutputReduce:
    case ActionType::kVocabInputReduce:
    case ActionType::kVocabInputBroadcast:
      return ExecuteVocabulary(a, st);
  }
  return absl::InternalError(absl::StrCat("unknown action type in ", Name(a)));
}

absl::Status StageExecutor::ExecuteVocabulary(const Action& a, StepState& st) {
  const LoweredProgram& program = *st.program;
  const int mb = a.microbatch;
  const std::string what = absl::StrCat(Name(a), " on rank ", rank_);
  // The vocabulary group: pipe, or pipe x model (its broadcasts start at a
  // stage's tensor rank 0: RootOf).
  const ModelParallelGroup& group = vocab_->group();
  const int first_rank = program.stage_to_rank[0];
  const int last_rank = program.stage_to_rank[program.num_virtual_stages() - 1];
  PP_ASSIGN_OR_RETURN(const MicroBatchData* data, Data(st, mb));
  if (data->inputs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the micro-batch has no token ids (inputs[0])"));
  }
  const torch::Tensor& ids = data->inputs[0];
  // A [ids.., D] buffer of the vocabulary's dtype: what a broadcast receives.
  auto hidden_like_ids = [&] {
    std::vector<int64_t> shape = ids.sizes().vec();
    shape.push_back(vocab_->dim());
    return torch::zeros(shape, vocab_->head().options().requires_grad(false));
  };
  // This micro-batch's entry of `from`, removed; undefined when absent.
  auto take = [&](std::map<int, torch::Tensor>& from) {
    auto it = from.find(mb);
    if (it == from.end()) return torch::Tensor();
    torch::Tensor t = std::move(it->second);
    from.erase(it);
    return t;
  };
  auto missing = [&](const char* needs) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", needs, " has not run"));
  };
  // This micro-batch's [ids.., D] tensor of `from` on pipe rank `holder`
  // (its stage's tensor ranks hold the same values, or under sequence
  // parallelism a slice each), whole on every rank of the group: a broadcast
  // from the stage's tensor rank 0, or the slices written into zeros and
  // summed (exact: one term per element is nonzero).
  // Started; its result is `from`'s entry again once finished.
  auto whole_on_every_rank = [&](std::map<int, torch::Tensor>& from, int holder,
                                 torch::ScalarType dtype, const char* needs,
                                 const std::string& what_mb) -> absl::Status {
    torch::Tensor held;
    if (rank_ == holder) {
      held = take(from);
      if (!held.defined()) return missing(needs);
    }
    tensor_parallel::PendingCollective work;
    if (vocab_->sequence_parallel()) {
      torch::Tensor whole = hidden_like_ids().to(dtype);
      if (held.defined()) vocab_->SequenceSlice(whole).copy_(held);
      work =
          tensor_parallel::StartAllReduce(whole, group, tensor_parallel::ReduceOp::kSum, what_mb);
    } else {
      torch::Tensor whole =
          held.defined() ? held.to(dtype).contiguous() : hidden_like_ids().to(dtype);
      work = tensor_parallel::StartBroadcast(whole, group, vocab_->RootOf(holder), what_mb);
    }
    return StartVocabCollective(st, a, std::move(work), [&from, mb](torch::Tensor whole) {
      from[mb] = std::move(whole);
      return absl::OkStatus();
    });
  };
  // The output layer's algorithm (Schedule::vocab_barriers).
  const bool one_barrier = program.vocab_barriers == 1;
  switch (a.type) {
    case ActionType::kVocabInputF:
      st.vocab_embedded[mb] = vocab_->Embed(ids).contiguous();
      return absl::OkStatus();
    case ActionType::kVocabInputReduce: {
      torch::Tensor share = take(st.vocab_embedded);
      if (!share.defined()) return missing("its IN_F");
      return StartVocabCollective(
          st, a,
          tensor_parallel::StartAllReduce(share, group, tensor_parallel::ReduceOp::kSum,
                                          absl::StrCat("the embedding of micro-batch ", mb)),
          [this, &st, mb, first_rank](torch::Tensor sum) {
            if (rank_ != first_rank) return absl::OkStatus();
            // Sequence parallelism: stage 0's layers take this rank's slice.
            if (vocab_->sequence_parallel()) sum = vocab_->SequenceSlice(sum).contiguous();
            if (!st.forward_only) sum.requires_grad_(true);
            st.vocab_embedded[mb] = std::move(sum);
            return absl::OkStatus();
          });
    }
    case ActionType::kVocabOutputBroadcast:
      return whole_on_every_rank(st.vocab_hidden, last_rank, vocab_->head().scalar_type(),
                                 "the last stage's F",
                                 absl::StrCat("the head's input of micro-batch ", mb));
    case ActionType::kVocabOutputS: {
      PP_RETURN_IF_ERROR(FinishVocabCollective(st, ActionType::kVocabOutputBroadcast, mb));
      torch::Tensor hidden = take(st.vocab_hidden);
      if (!hidden.defined()) return missing("its OUT_BCAST");
      st.vocab_stats[mb] = vocab_
                               ->OutputS(mb, hidden, data->batch.Get(vocab_labels_key_),
                                         /*partial=*/one_barrier && !st.forward_only)
                               .unsqueeze(0);
      return absl::OkStatus();
    }
    case ActionType::kVocabOutputStats: {
      torch::Tensor stats = take(st.vocab_stats);
      if (!stats.defined()) return missing("its OUT_S");
      ModelParallelGroup over = group;
      if (tensor_parallel::internal::CurrentFault() ==
              tensor_parallel::internal::PlantedFault::kVocabStatsOverPipeOnly &&
          vocab_->tensor_size() > 1 && pipe_group_) {
        // Planted (tests only): the pipe group alone, as at tp = 1.
        over.group = pipe_group_;
        over.rank = rank_;
        over.size = pipe_group_->getSize();
      }
      // Finished by the first reader of the combined statistics (OUT_T, or
      // with one barrier OUT_REDUCE), or before the step's tail.
      return StartVocabCollective(
          st, a,
          tensor_parallel::StartAllGather(
              stats, over, 0, absl::StrCat("the softmax statistics of micro-batch ", mb)),
          [this, &st, mb, data, last_rank](torch::Tensor gathered) {
            const torch::Tensor loss = vocab_->Combine(mb, gathered);
            if (st.forward_only) vocab_->Drop(mb);  // evaluation: no OUT_T
            if (rank_ != last_rank && st.forward_only) return absl::OkStatus();
            // As the dense loss reduces (ReduceTokenLosses): the mean over the
            // counted tokens, or with per-token loss the mask (the Trainer
            // divides by the global batch's trained tokens). Computed once
            // for the loss and the passes' gradients.
            const torch::Tensor weights =
                VocabTokenWeights(*data, vocab_labels_key_, vocab_->ignore_index());
            if (rank_ == last_rank) {
              st.stats.loss_sum += (loss * weights).sum().item<double>();
              st.stats.losses_computed += 1;
            }
            if (!st.forward_only) {
              // d step loss / d token loss, scaled as ScaledLoss scales the
              // dense loss (1/m, or dp / global_loss_tokens with per-token
              // loss); OUT_T (and with one barrier OUT_REDUCE before it)
              // reads it.
              const int m = st.program->num_microbatches;
              torch::Tensor scale = ScaledLoss(weights, *data, m);
              if (options_.loss_normalization_fault == LossNormalizationFault::kDroppedMicroBatch &&
                  mb == m - 1) {
                scale.zero_();
              }
              st.vocab_grad_scale[mb] = scale;
            }
            return absl::OkStatus();
          });
    }
    case ActionType::kVocabOutputT: {
      PP_RETURN_IF_ERROR(FinishVocabCollective(st, ActionType::kVocabOutputStats, mb));
      const torch::Tensor scale = take(st.vocab_grad_scale);  // its last reader
      if (!scale.defined()) return missing("its OUT_STATS");
      if (one_barrier) {
        vocab_->OutputWeightGrad(mb, scale);
      } else {
        st.vocab_hidden_grad[mb] = vocab_->OutputT(mb, scale).contiguous();
      }
      // The head rows' gradient is final for this micro-batch, as after a B.
      if (after_backward_) after_backward_();
      return absl::OkStatus();
    }
    case ActionType::kVocabOutputReduce: {
      // One barrier: OUT_S's partial, rescaled now that the stats are here.
      torch::Tensor share;
      if (one_barrier) {
        PP_RETURN_IF_ERROR(FinishVocabCollective(st, ActionType::kVocabOutputStats, mb));
        auto scale = st.vocab_grad_scale.find(mb);
        if (scale == st.vocab_grad_scale.end()) return missing("its OUT_STATS");
        share = vocab_->RescaledPartial(mb, scale->second).contiguous();
      } else {
        share = take(st.vocab_hidden_grad);
        if (!share.defined()) return missing("its OUT_T");
      }
      return StartVocabCollective(
          st, a,
          tensor_parallel::StartAllReduce(
              share, group, tensor_parallel::ReduceOp::kSum,
              absl::StrCat("the head input's gradient of micro-batch ", mb)),
          [this, &st, mb, last_rank](torch::Tensor sum) {
            if (rank_ == last_rank) {
              st.vocab_hidden_grad[mb] =
                  vocab_->sequence_parallel() ? vocab_->SequenceSlice(sum).contiguous() : sum;
            }
            return absl::OkStatus();
          });
    }
    case ActionType::kVocabInputBroadcast:
      return whole_on_every_rank(st.vocab_input_grad, first_rank, vocab_->embedding().scalar_type(),
                                 "stage 0's backward",
                                 absl::StrCat("the embedding's gradient of micro-batch ", mb));
    case ActionType::kVocabInputB: {
      PP_RETURN_IF_ERROR(FinishVocabCollective(st, ActionType::kVocabInputBroadcast, mb));
      torch::Tensor grad = take(st.vocab_input_grad);
      if (!grad.defined()) return missing("its IN_BCAST");
      vocab_->EmbedBackward(ids, grad);
      if (after_backward_) after_backward_();
      return absl::OkStatus();
    }
    default:
      return absl::InternalError(absl::StrCat(what, ": not a vocabulary action"));
  }
}

absl::Status StageExecutor::StartVocabCollective(
    StepState& st, const Action& a, tensor_parallel::PendingCollective work,
    std::function<absl::Status(torch::Tensor)> finish) {
  std::shared_ptr<const std::atomic<int64_t>> completed_us;
  // Only an observed asynchronous step learns when its collectives completed.
  if (st.vocab_async && observer_ != nullptr) completed_us = work.TrackCompletion();
  st.vocab_pending.push_back(
      {a.type, a.microbatch, a.stage, std::move(work), std::move(finish), std::move(completed_us)});
  if (st.vocab_async) return absl::OkStatus();
  return FinishVocabCollective(st, a.type, a.microbatch);
}

absl::Status StageExecutor::FinishVocabCollective(StepState& st, ActionType type, int mb) {
  auto until = std::find_if(
      st.vocab_pending.begin(), st.vocab_pending.end(),
      [&](const PendingVocabCollective& p) { return p.type == type && p.microbatch == mb; });
  if (until == st.vocab_pending.end()) return absl::OkStatus();
  ++until;
  for (auto it = st.vocab_pending.begin(); it != until;) {
    if (it->type != type) {
      ++it;
      continue;
    }
    // Out of the list first: a failed wait leaves nothing to wait for twice.
    PendingVocabCollective pending = std::move(*it);
    it = st.vocab_pending.erase(it);
    PP_RETURN_IF_ERROR(FinishPendingVocabCollective(st, std::move(pending)));
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::FinishPendingVocabCollective(StepState& st,
                                                         PendingVocabCollective pending) {
  PP_ASSIGN_OR_RETURN(torch::Tensor result, pending.work.Wait());
  if (pending.completed_us != nullptr) {
    st.vocab_finished.push_back({Action{pending.stage, pending.type, pending.microbatch},
                                 pending.completed_us, SteadyClockMicros()});
  }
  return pending.finish(std::move(result));
}

absl::Status StageExecutor::FinishCompletedVocabCollectives(StepState& st) {
  std::set<ActionType> in_flight;  // kinds with an earlier one not yet complete
  for (auto it = st.vocab_pending.begin(); it != st.vocab_pending.end();) {
    if (in_flight.count(it->type) > 0 || !it->work.Completed()) {
      in_flight.insert(it->type);
      ++it;
      continue;
    }
    PendingVocabCollective pending = std::move(*it);
    it = st.vocab_pending.erase(it);
    PP_RETURN_IF_ERROR(FinishPendingVocabCollective(st, std::move(pending)));
  }
  return absl::OkStatus();
}

void StageExecutor::ReportVocabCompletions(const ObservedStep& step,
                                           const std::vector<FinishedVocabCollective>& finished,
                                           ActionObserver& observer) {
  int patience_ms = 100;
  for (const FinishedVocabCollective& f : finished) {
    // Complete when its wait returned: a callback that came later says so late.
    const int64_t completed =
        AwaitCompletionTime(*f.completed_us, &patience_ms).value_or(f.waited_us);
    observer.CollectiveCompleted(step, f.started, std::min(completed, f.waited_us));
  }
}

absl::Status StageExecutor::FinishVocabCollectivesReadBy(const Action& a, StepState& st) {
  if (st.vocab_pending.empty()) return absl::OkStatus();
  if (IsTail(a.type)) return FinishVocabCollectives(st);
  const std::optional<Action> read =
      VocabCollectiveReadBy(a, st.program->num_virtual_stages(), st.program->vocab_barriers);
  return read ? FinishVocabCollective(st, read->type, read->microbatch) : absl::OkStatus();
}

absl::Status StageExecutor::FinishVocabCollectives(StepState& st) {
  while (!st.vocab_pending.empty()) {
    const PendingVocabCollective& first = st.vocab_pending.front();
    PP_RETURN_IF_ERROR(FinishVocabCollective(st, first.type, first.microbatch));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> StageExecutor::Run(const LoweredProgram& program, int64_t step,
                                             const TailFn& tail, MicroBatchSource* source) {
  PP_RETURN_IF_ERROR(Validate(program));
  const LoweredProgram exec_program = options_.defer_receives ? DeferReceives(program) : program;
  StepState st;
  st.source = source != nullptr ? source : source_;
  if (st.source == nullptr)
    return absl::InvalidArgumentError("StageExecutor::Run needs a MicroBatchSource");
  st.program = &program;
  st.step = step;
  st.forward_only = program.forward_only;
  st.vocab_async = options_.vocabulary_async_collectives && !program.forward_only;
  // Every rank runs the same kind of program at the same time, so both ends
  // of each channel switch together (static p2p shapes are learned per pass).
  p2p_.SetForwardOnly(program.forward_only);
  // post_receives_ahead (CPU only): each channel's receives in program
  // order; a RECV action waits for the one posted for it.
  std::map<ChannelId, Channel> channels;
  const bool post_ahead = options_.post_receives_ahead && options_.p2p.device.is_cpu();
  if (post_ahead) {
    if (p2p_.posted_receives() != 0) {
      return absl::InternalError(absl::StrCat("rank ", rank_, ": ", p2p_.posted_receives(),
                                              " receive(s) still posted from an earlier run"));
    }
    for (const Action& a : exec_program.ranks[rank_]) {
      for (const Action& leaf : Leaves(a)) {
        if (IsReceive(leaf.type)) {
          channels[ChannelOf(leaf)].receives.push_back(leaf);
        }
      }
    }
  }
  ActionObserver* const observer = observer_;
  const ObservedStep observed{rank_, step, program.forward_only, &exec_program};
  if (observer != nullptr) observer->StepStart(observed);
  // Runs one action. False (with status_holder_ set) on error.
  auto run = [&](const Action& a) {
    // Asynchronous vocabulary collectives: the wait for the results `a`
    // reads is idle time before it, not part of its span.
    absl::Status s = FinishVocabCollectivesReadBy(a, st);
    // And the complete ones no action waited for yet: a result this rank
    // never reads (IN_REDUCE off stage 0's rank, OUT_REDUCE off the last
    // stage's) would otherwise keep its buffer until the step's tail.
    if (s.ok() && st.vocab_async) s = FinishCompletedVocabCollectives(st);
    if (observer != nullptr) observer->ActionStart(observed, a);
    if (s.ok() && post_ahead && IsReceive(a.type)) {
      // Waits for the receive posted for it (posting it first if it could
      // not be posted yet: then it is its channel's next one).
      Channel& channel = channels[ChannelOf(a)];
      if (!channel.posted) s = PostReady(st, channels);
      if (s.ok() && !channel.posted) {
        // Still unpostable (RECV_B before its F): Execute names the error.
        channel.receives.pop_front();
      }
      channel.posted = false;
    }
    if (s.ok()) s = Execute(a, st, tail);
    // The receives this action made postable (its channel's next one; a
    // gradient receive after its F).
    if (s.ok() && post_ahead) s = PostReady(st, channels);
    if (!s.ok()) {
      status_holder_ = absl::Status(s.code(), absl::StrCat("step ", step, ": ", s.message()));
      return false;
    }
    if (observer != nullptr) observer->ActionEnd(observed, a);
    return true;
  };
  absl::Status status = TorchCall(absl::StrCat("step ", step, " on rank ", rank_), [&] {
    std::optional<torch::NoGradGuard> no_grad;
    if (st.forward_only) no_grad.emplace();
    if (post_ahead) {
      absl::Status s = PostReady(st, channels);
      if (!s.ok()) {
        status_holder_ = absl::Status(s.code(), absl::StrCat("step ", step, ": ", s.message()));
        return;
      }
    }
    for (const Action& a : exec_program.ranks[rank_]) {
      // OVERLAP_F_B: the forward half, then the backward half, back to back
      // on this thread (no overlap), each observed as its own action.
      for (const Action& half : Leaves(a)) {
        if (!run(half)) return;
      }
    }
    // Vocabulary collectives no action read (a program without a tail).
    absl::Status s = FinishVocabCollectives(st);
    if (!s.ok())
      status_holder_ = absl::Status(s.code(), absl::StrCat("step ", step, ": ", s.message()));
  });
  // A failed step waits for none of its pending vocabulary collectives (each
  // backend work ends by itself within the group's timeout).
  st.vocab_pending.clear();
  if (status.ok() && status_holder_.ok() && observer != nullptr) {
    ReportVocabCompletions(observed, st.vocab_finished, *observer);
  }
  if (status.ok() && !status_holder_.ok()) status = status_holder_;
  status_holder_ = absl::OkStatus();
  if (status.ok() && p2p_.posted_receives() != 0) {
    status = absl::InternalError(absl::StrCat("program of rank ", rank_, " left ",
                                              p2p_.posted_receives(),
                                              " posted receive(s) not waited for"));
  }
  // A failed step leaves no receive posted into buffers that go away (and
  // none that a later pass would take for its own).
  if (!status.ok()) p2p_.AbortPostedReceives();
  if (status.ok()) status = p2p_.WaitSends();
  if (!status.ok() && vocab_ != nullptr) vocab_->Clear();
  if (status.ok() && !st.stash.empty()) {
    status = absl::InternalError(absl::StrCat("program of rank ", rank_, " left ", st.stash.size(),
                                              " stashed micro-batches without backward"));
  }
  if (observer != nullptr) {
    absl::Status observed_status = observer->StepEnd(observed, status);
    if (status.ok()) status = std::move(observed_status);
  }
  if (!status.ok()) return status;
  return std::move(st.stats);
}

}  // namespace pp
