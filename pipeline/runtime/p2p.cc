#include "pipeline/runtime/p2p.h"

#include <algorithm>
#include <exception>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "pipeline/tensor_parallel/mappings.h"
#include "pipeline/tensor_parallel/planted_fault.h"

namespace pp {
namespace {

// "{float[8, 64, 128] grad, ...}" for errors that compare two layouts.
std::string LayoutString(const std::vector<TensorMeta>& layout) {
  std::vector<std::string> parts;
  for (const TensorMeta& m : layout) parts.push_back(m.DebugString());
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

}  // namespace

std::vector<TensorMeta> LayoutOf(const Activations& tensors) {
  std::vector<TensorMeta> layout;
  layout.reserve(tensors.size());
  for (const torch::Tensor& t : tensors) {
    TensorMeta meta;
    meta.dtype = t.scalar_type();
    meta.shape = t.sizes().vec();
    meta.requires_grad = t.is_floating_point() && t.requires_grad();
    layout.push_back(std::move(meta));
  }
  return layout;
}

P2P::P2P(c10::intrusive_ptr<c10d::ProcessGroup> group, P2POptions options)
    : group_(std::move(group)), options_(std::move(options)), streams_(options_.device) {}

P2P::~P2P() {
  // Outstanding sends keep their tensors alive themselves; waiting here (with
  // the timeout) keeps a destroyed executor from racing its own transfers.
  absl::Status s = WaitSends();
  LOG_IF(WARNING, !s.ok()) << "p2p shut down with sends unfinished: " << s;
  if (posted_receives() > 0) AbortPostedReceives();
}

P2PStats P2P::stats() const {
  P2PStats s = stats_;
  s.receives_posted_now = posted_receives();
  return s;
}

int P2P::rank() const { return group_->getRank(); }

absl::StatusOr<int> P2P::Tag(Kind kind, int src_stage, int dst_stage) const {
  if (src_stage < 0 || src_stage >= kMaxStages || dst_stage < 0 || dst_stage >= kMaxStages) {
    return absl::InvalidArgumentError(absl::StrCat("p2p stage ids (", src_stage, ", ", dst_stage,
                                                   ") must be in [0, ", kMaxStages, ")"));
  }
  return ((src_stage * kMaxStages) + dst_stage) * 2 + static_cast<int>(kind);
}

std::string P2P::PeerName(int peer) const {
  if (peer >= 0 && peer < static_cast<int>(options_.global_ranks.size())) {
    return absl::StrCat("global rank ", options_.global_ranks[peer], " (stage ", peer, ")");
  }
  return absl::StrCat("rank ", peer);
}

absl::Status P2P::PostSend(torch::Tensor tensor, int peer, int tag, const std::string& what) {
  if (tensor.numel() == 0) return absl::OkStatus();
  torch::Tensor payload;
  PP_RETURN_IF_ERROR(TorchCall(absl::StrCat(what, ": send to ", PeerName(peer)),
                               [&] { payload = tensor.detach().contiguous(); }));
  const auto start = std::chrono::steady_clock::now();
  absl::Status s;
  if (streams_.active()) {
    // On a device, post here, in call order, on the send stream: NCCL pairs
    // sends and receives by order (device_streams.h).
    s = streams_.Send([&] {
      c10::intrusive_ptr<c10d::Work> work;
      PP_RETURN_IF_ERROR(TorchCall(absl::StrCat(what, ": send to ", PeerName(peer)), [&] {
        std::vector<at::Tensor> one = {payload};
        work = group_->send(one, peer, tag);
      }));
      in_flight_.push_back(PendingSend{std::move(work), peer, what});
      return absl::OkStatus();
    });
  } else {
    // Posted in call order from this thread: Gloo matches messages of one
    // (peer, tag) in posting order, so channel order holds.
    c10::intrusive_ptr<c10d::Work> work;
    s = TorchCall(absl::StrCat(what, ": send to ", PeerName(peer)), [&] {
      std::vector<at::Tensor> one = {payload};
      work = group_->send(one, peer, tag);
    });
    if (s.ok()) in_flight_.push_back(PendingSend{std::move(work), peer, what});
  }
  stats_.send_post_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  PP_RETURN_IF_ERROR(s);
  ++stats_.tensor_messages;
  return absl::OkStatus();
}

absl::Status P2P::RecvInto(torch::Tensor& tensor, int peer, int tag, const std::string& what) {
  if (tensor.numel() == 0) return absl::OkStatus();
  bool completed = false;
  absl::Status s = streams_.Recv([&] {
    return TorchCall(absl::StrCat(what, ": receive from ", PeerName(peer)), [&] {
      std::vector<at::Tensor> one = {tensor};
      c10::intrusive_ptr<c10d::Work> work = group_->recv(one, peer, tag);
      completed = work->wait(options_.timeout);
    });
  });
  return RecvOutcome(s, completed, peer, absl::StrCat(what, ": receive from "));
}

absl::Status P2P::RecvOutcome(const absl::Status& wait, bool completed, int peer,
                              const std::string& what_from) const {
  if (!wait.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(wait.message(), " (peer ", PeerName(peer),
                                                    " died, hung or is out of step; timeout ",
                                                    options_.timeout.count(), " ms)"));
  }
  if (!completed)
    return absl::AbortedError(absl::StrCat(what_from, PeerName(peer), " was aborted"));
  return absl::OkStatus();
}

absl::Status P2P::ReapCompletedSends() {
  // Completed sends are dropped so that their tensors can be freed; errors
  // surface in WaitSends.
  auto it = std::remove_if(in_flight_.begin(), in_flight_.end(), [](const PendingSend& p) {
    return p.work->isCompleted() && p.work->isSuccess();
  });
  in_flight_.erase(it, in_flight_.end());
  return absl::OkStatus();
}

absl::Status P2P::WaitSends() {
  std::vector<PendingSend> pending;
  absl::Status first_error;
  pending.swap(in_flight_);
  for (PendingSend& p : pending) {
    absl::Status s = TorchCall(absl::StrCat(p.what, ": send to ", PeerName(p.peer)), [&] {
      if (!p.work->wait(options_.timeout)) {
        throw std::runtime_error("aborted");
      }
    });
    if (!s.ok() && first_error.ok()) {
      first_error = absl::DeadlineExceededError(absl::StrCat(
          s.message(), " (peer ", PeerName(p.peer), " died, hung or is out of step; timeout ",
          options_.timeout.count(), " ms)"));
    }
  }
  return first_error;
}

int64_t P2PBufferCapacity(int64_t numel) {
  if (numel <= 16) return numel;
  // numel in [2^k, 2^(k+1)): round up to a multiple of 2^(k-3), i.e. to one
  // of eight steps per octave (at most 1/8 more than asked).
  int k = 0;
  while ((numel >> (k + 1)) != 0) ++k;
  const int64_t step = int64_t{1} << (k - 3);
  return (numel + step - 1) / step * step;
}

torch::Tensor P2P::TakeBuffer(c10::ScalarType dtype, const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const int64_t capacity = P2PBufferCapacity(numel);
  torch::Tensor flat;
  auto it = pool_.find({static_cast<int>(dtype), capacity});
  if (it != pool_.end() && !it->second.empty()) {
    flat = std::move(it->second.back());
    it->second.pop_back();
    ++stats_.buffers_reused;
  } else {
    ++stats_.buffers_allocated;
    flat = torch::empty({capacity}, torch::TensorOptions().dtype(dtype).device(options_.device));
  }
  // The shape over the buffer's storage as a tensor of its own (not a view,
  // whose base would keep a second reference and block Recycle).
  std::vector<int64_t> strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * shape[i + 1];
  }
  torch::Tensor t = torch::empty({0}, flat.options()).set_(flat.storage(), 0, shape, strides);
  return t;
}

void P2P::Recycle(Activations tensors) {
  for (torch::Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    // Only a buffer nobody else can see is safe to overwrite: a layer may have
    // returned it as its output (and that output may still be in flight), or
    // a view of it may live on in a caller's data.
    if (t.use_count() != 1 || !t.has_storage() || t.storage().use_count() != 1 ||
        !t.is_contiguous() || t.storage_offset() != 0) {
      continue;
    }
    // The whole storage goes back, under its capacity class; a storage of
    // another size (not one of ours) is dropped.
    const int64_t capacity =
        static_cast<int64_t>(t.storage().nbytes()) / static_cast<int64_t>(t.element_size());
    if (capacity != P2PBufferCapacity(capacity)) continue;
    torch::Tensor buffer =
        torch::empty({0}, t.options().requires_grad(false)).set_(t.storage(), 0, {capacity}, {1});
    t.reset();
    if (buffer.storage().use_count() != 1) continue;
    pool_[{static_cast<int>(buffer.scalar_type()), capacity}].push_back(std::move(buffer));
  }
}

void P2P::ResetShapes() {
  if (posted_receives() > 0) {
    LOG(WARNING) << "p2p: ResetShapes with " << posted_receives()
                 << " posted receive(s) outstanding; aborting them";
    AbortPostedReceives();
  }
  sent_headers_.clear();
  received_headers_.clear();
  learned_sent_.clear();
  learned_received_.clear();
  pool_.clear();
}

absl::Status P2P::SendActivations(int peer, int src_stage, int dst_stage,
                                  const Activations& tensors, const std::string& what,
                                  int64_t message_id) {
  PP_RETURN_IF_ERROR(ReapCompletedSends());
  PP_ASSIGN_OR_RETURN(const int tag, Tag(Kind::kActivation, src_stage, dst_stage));
  std::vector<TensorMeta> layout = LayoutOf(tensors);
  if (options_.static_shapes && !forward_only_ &&
      learned_sent_.count(ChannelKey{src_stage, dst_stage}) > 0) {
    const std::vector<TensorMeta>& learned = learned_sent_.at(ChannelKey{src_stage, dst_stage});
    if (learned != layout) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": static p2p shapes: activation channel stage ", src_stage, " -> stage ",
          dst_stage, " (to ", PeerName(peer), ") learned the layout ", LayoutString(learned),
          " from its first message, but this payload is ", LayoutString(layout),
          "; nothing was sent. Every message of a channel must keep its first layout in this "
          "mode: turn static shapes off for activations whose shapes vary "
          "(parallelism.p2p_static_shapes: false, --p2p_static_shapes=false; "
          "P2POptions::static_shapes)"));
    }
    ++stats_.static_payloads;
  } else {
    // The first training message of a channel: both sides learn its layout.
    if (options_.static_shapes && !forward_only_) {
      learned_sent_[ChannelKey{src_stage, dst_stage}] = layout;
    }
    const ChannelKey key{src_stage, dst_stage};
    auto it = sent_headers_.find(key);
    const bool same = it != sent_headers_.end() && it->second == layout;
    const std::vector<int64_t> words =
        EncodeControl(same ? nullptr : &layout, message_id, options_.static_shapes);
    torch::Tensor control = torch::tensor(words, torch::kInt64);
    torch::Tensor header;
    if (!same) {
      if (words[0] == kHeaderFollows) header = torch::tensor(EncodeHeader(layout), torch::kInt64);
      sent_headers_[key] = layout;
      ++stats_.header_messages;
    }
    ++stats_.control_messages;
    PP_RETURN_IF_ERROR(PostSend(control.to(options_.device), peer, tag, what));
    if (header.defined()) PP_RETURN_IF_ERROR(PostSend(header.to(options_.device), peer, tag, what));
  }
  return PostPayload(tensors, peer, tag, what);
}

bool P2P::SplitsPayload(c10::ScalarType dtype) const {
  return options_.split_payloads_over.is_parallel() && !streams_.active() &&
         c10::isFloatingType(dtype);
}

std::vector<int64_t> P2P::WireShape(const TensorMeta& meta) const {
  if (!SplitsPayload(meta.dtype)) return meta.shape;
  int64_t numel = 1;
  for (int64_t d : meta.shape) numel *= d;
  const int64_t parts = options_.split_payloads_over.size;
  return {(numel + parts - 1) / parts};
}

torch::Tensor P2P::PartToSend(const torch::Tensor& tensor) const {
  if (!SplitsPayload(tensor.scalar_type()) || tensor.numel() == 0) return tensor;
  const ModelParallelGroup& group = options_.split_payloads_over;
  torch::Tensor flat = tensor.detach().reshape({-1});
  const int64_t part = (flat.numel() + group.size - 1) / group.size;
  if (part * group.size != flat.numel()) {
    flat = torch::cat({flat, torch::zeros({part * group.size - flat.numel()}, flat.options())});
  }
  const int64_t rank = tensor_parallel::internal::CurrentFault() ==
                               tensor_parallel::internal::PlantedFault::kWrongPayloadPart
                           ? (group.rank + 1) % group.size
                           : group.rank;
  return flat.narrow(0, rank * part, part);
}

absl::StatusOr<torch::Tensor> P2P::Assemble(torch::Tensor part, const TensorMeta& meta,
                                            const std::string& what) {
  if (!SplitsPayload(meta.dtype)) return part;
  torch::Tensor whole;
  PP_RETURN_IF_ERROR(TorchCall(absl::StrCat(what, ": all-gather of a p2p payload's parts over ",
                                            options_.split_payloads_over.description),
                               [&] {
                                 // Into a pooled buffer, as a whole payload arrives, so that
                                 // Recycle() takes it back.
                                 whole = TakeBuffer(meta.dtype, meta.shape);
                                 if (whole.numel() == 0) return;
                                 const torch::Tensor parts =
                                     tensor_parallel::AllGather(part, options_.split_payloads_over,
                                                                0, "a p2p payload's parts");
                                 whole.view({-1}).copy_(parts.narrow(0, 0, whole.numel()));
                               }));
  Recycle({std::move(part)});
  return whole;
}

absl::Status P2P::PostPayload(const Activations& tensors, int peer, int tag,
                              const std::string& what) {
  for (const torch::Tensor& t : tensors) {
    torch::Tensor wire;
    PP_RETURN_IF_ERROR(TorchCall(absl::StrCat(what, ": this rank's part of a payload"),
                                 [&] { wire = PartToSend(t); }));
    PP_RETURN_IF_ERROR(PostSend(wire, peer, tag, what));
    stats_.payload_bytes_sent += static_cast<int64_t>(wire.nbytes());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorMeta>> P2P::LayoutFromControl(torch::Tensor control, int peer,
                                                               int tag, int src_stage,
                                                               int dst_stage,
                                                               const std::string& what,
                                                               int64_t* message_id) {
  control = control.cpu();
  const int64_t* c = control.data_ptr<int64_t>();
  absl::StatusOr<ControlMessage> message =
      DecodeControl(std::vector<int64_t>(c, c + kControlWords));
  if (!message.ok()) {
    return absl::DataLossError(
        absl::StrCat(what, ": from ", PeerName(peer), ": ", message.status().message()));
  }
  if (message->static_shapes != options_.static_shapes) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", PeerName(peer), " sends activations with static p2p shapes ",
                     message->static_shapes ? "on" : "off", " but this rank has them ",
                     options_.static_shapes ? "on" : "off",
                     "; every rank must use the same setting (parallelism.p2p_static_shapes, "
                     "--p2p_static_shapes; P2POptions::static_shapes)"));
  }
  if (message_id != nullptr) *message_id = message->message_id;
  const ChannelKey key{src_stage, dst_stage};
  std::vector<TensorMeta> layout;
  if (message->kind == ControlKind::kSameHeader) {
    auto it = received_headers_.find(key);
    if (it == received_headers_.end()) {
      return absl::DataLossError(absl::StrCat(what, ": ", PeerName(peer),
                                              " said 'same header' on a channel with no "
                                              "header yet"));
    }
    layout = it->second;
  } else {
    if (message->kind == ControlKind::kInlineHeader) {
      layout = std::move(message->layout);
    } else {
      torch::Tensor header = torch::empty({message->header_length},
                                          torch::dtype(torch::kInt64).device(options_.device));
      PP_RETURN_IF_ERROR(RecvInto(header, peer, tag, what));
      header = header.cpu();
      const int64_t* h = header.data_ptr<int64_t>();
      absl::StatusOr<std::vector<TensorMeta>> decoded =
          DecodeHeader(std::vector<int64_t>(h, h + message->header_length));
      if (!decoded.ok()) {
        return absl::DataLossError(
            absl::StrCat(what, ": from ", PeerName(peer), ": ", decoded.status().message()));
      }
      layout = *std::move(decoded);
    }
    received_headers_[key] = layout;
  }
  if (options_.static_shapes && !forward_only_) learned_received_[key] = layout;
  return layout;
}

absl::StatusOr<Activations> P2P::RecvActivations(int peer, int src_stage, int dst_stage,
                                                 const std::string& what, int64_t* message_id) {
  if (message_id != nullptr) *message_id = -1;
  auto posted = posted_.find(PostKey{static_cast<int>(Kind::kActivation), src_stage, dst_stage});
  if (posted != posted_.end() && !posted->second.empty()) {
    return WaitPosted(Kind::kActivation, peer, src_stage, dst_stage, nullptr, what, message_id);
  }
  PP_ASSIGN_OR_RETURN(const int tag, Tag(Kind::kActivation, src_stage, dst_stage));
  std::vector<TensorMeta> layout;
  const ChannelKey static_key{src_stage, dst_stage};
  auto learned = options_.static_shapes && !forward_only_ ? learned_received_.find(static_key)
                                                          : learned_received_.end();
  if (learned != learned_received_.end()) {
    layout = learned->second;
  } else {
    torch::Tensor control =
        torch::empty({kControlWords}, torch::dtype(torch::kInt64).device(options_.device));
    PP_RETURN_IF_ERROR(RecvInto(control, peer, tag, what));
    PP_ASSIGN_OR_RETURN(layout, LayoutFromControl(std::move(control), peer, tag, src_stage,
                                                  dst_stage, what, message_id));
  }
  Activations out;
  out.reserve(layout.size());
  for (const TensorMeta& meta : layout) {
    torch::Tensor t;
    PP_RETURN_IF_ERROR(TorchCall(
        absl::StrCat(what, ": buffer ", meta.DebugString(), " for ", PeerName(peer), "'s payload"),
        [&] { t = TakeBuffer(meta.dtype, WireShape(meta)); }));
    PP_RETURN_IF_ERROR(RecvInto(t, peer, tag, what));
    PP_ASSIGN_OR_RETURN(t, Assemble(std::move(t), meta, what));
    if (meta.requires_grad && c10::isFloatingType(meta.dtype)) t.requires_grad_(true);
    out.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<c10::intrusive_ptr<c10d::Work>> P2P::PostRecv(torch::Tensor& tensor, int peer,
                                                             int tag, const std::string& what) {
  c10::intrusive_ptr<c10d::Work> work;
  if (tensor.numel() == 0) return work;
  PP_RETURN_IF_ERROR(TorchCall(absl::StrCat(what, ": post receive from ", PeerName(peer)), [&] {
    std::vector<at::Tensor> one = {tensor};
    work = group_->recv(one, peer, tag);
  }));
  return work;
}

absl::Status P2P::WaitRecv(const c10::intrusive_ptr<c10d::Work>& work, int peer,
                           const std::string& what) {
  if (!work) return absl::OkStatus();
  bool completed = false;
  absl::Status s = TorchCall(absl::StrCat(what, ": posted receive from ", PeerName(peer)),
                             [&] { completed = work->wait(options_.timeout); });
  return RecvOutcome(s, completed, peer, absl::StrCat(what, ": posted receive from "));
}

absl::Status P2P::AdvancePosts(std::deque<PostedRecv>& queue) {
  for (PostedRecv& r : queue) {
    if (r.payload_posted) continue;
    // A control word posted ahead: the sender sends control first, so the
    // payload waits for it to be read (in WaitPosted).
    if (r.control.defined()) return absl::OkStatus();
    if (!r.layout_known) {
      const ChannelKey key{r.src_stage, r.dst_stage};
      auto learned = options_.static_shapes && !r.forward_only ? learned_received_.find(key)
                                                               : learned_received_.end();
      if (learned != learned_received_.end()) {
        r.layout = learned->second;
        r.layout_known = true;
      } else {
        // Only the control word can go ahead; nothing after it on this
        // channel until its payload is posted (when it is waited for).
        PP_RETURN_IF_ERROR(TorchCall(absl::StrCat(r.what, ": control buffer"), [&] {
          r.control =
              torch::empty({kControlWords}, torch::dtype(torch::kInt64).device(options_.device));
        }));
        PP_ASSIGN_OR_RETURN(r.control_work, PostRecv(r.control, r.peer, r.tag, r.what));
        ++stats_.controls_posted_ahead;
        return absl::OkStatus();
      }
    }
    for (const TensorMeta& meta : r.layout) {
      if (r.kind == Kind::kGradient && !meta.requires_grad) continue;
      torch::Tensor t;
      PP_RETURN_IF_ERROR(TorchCall(absl::StrCat(r.what, ": buffer ", meta.DebugString(), " for ",
                                                PeerName(r.peer), "'s payload"),
                                   [&] { t = TakeBuffer(meta.dtype, WireShape(meta)); }));
      r.buffers.push_back(t);
      PP_ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Work> work, PostRecv(t, r.peer, r.tag, r.what));
      r.works.push_back(std::move(work));
      if (t.numel() > 0) ++stats_.payloads_posted_ahead;
    }
    r.payload_posted = true;
  }
  return absl::OkStatus();
}

absl::Status P2P::PostRecvActivations(int peer, int src_stage, int dst_stage,
                                      const std::string& what) {
  return PostAhead(Kind::kActivation, peer, src_stage, dst_stage, nullptr, what);
}

absl::Status P2P::PostRecvGrads(int peer, int src_stage, int dst_stage,
                                const std::vector<TensorMeta>& sent_layout,
                                const std::string& what) {
  return PostAhead(Kind::kGradient, peer, src_stage, dst_stage, &sent_layout, what);
}

absl::Status P2P::PostAhead(Kind kind, int peer, int src_stage, int dst_stage,
                            const std::vector<TensorMeta>* layout, const std::string& what) {
  PP_ASSIGN_OR_RETURN(const int tag, Tag(kind, src_stage, dst_stage));
  if (streams_.active()) return absl::OkStatus();  // see the file comment
  std::deque<PostedRecv>& queue = posted_[PostKey{static_cast<int>(kind), src_stage, dst_stage}];
  PostedRecv r;
  r.kind = kind;
  r.peer = peer;
  r.src_stage = src_stage;
  r.dst_stage = dst_stage;
  r.tag = tag;
  r.what = what;
  r.forward_only = forward_only_;
  if (layout != nullptr) {
    r.layout = *layout;
    r.layout_known = true;
  }
  queue.push_back(std::move(r));
  absl::Status s = AdvancePosts(queue);
  if (!s.ok()) AbortPostedReceives();
  return s;
}

absl::StatusOr<Activations> P2P::WaitPosted(Kind kind, int peer, int src_stage, int dst_stage,
                                            const std::vector<TensorMeta>* grad_layout,
                                            const std::string& what, int64_t* message_id) {
  std::deque<PostedRecv>& queue = posted_[PostKey{static_cast<int>(kind), src_stage, dst_stage}];
  PostedRecv& r = queue.front();
  absl::Status s;
  if (r.peer != peer) {
    s = absl::InternalError(absl::StrCat(what, ": the receive posted on this channel (", r.what,
                                         ") is from ", PeerName(r.peer), ", not ", PeerName(peer)));
  } else if (r.forward_only != forward_only_) {
    s = absl::InternalError(
        absl::StrCat(what, ": the receive posted on this channel (", r.what, ") belongs to a ",
                     r.forward_only ? "forward-only" : "training", " pass; passes must not mix"));
  } else if (grad_layout != nullptr && *grad_layout != r.layout) {
    s = absl::InternalError(absl::StrCat(what, ": gradients posted for layout ",
                                         LayoutString(r.layout), " but waited for with ",
                                         LayoutString(*grad_layout)));
  }
  Activations out;
  if (s.ok() && !r.payload_posted) {
    // Dynamic-shape activations: the control word was posted ahead.
    s = WaitRecv(r.control_work, peer, what);
    if (s.ok()) {
      r.control_work.reset();
      absl::StatusOr<std::vector<TensorMeta>> layout =
          LayoutFromControl(r.control, peer, r.tag, src_stage, dst_stage, what, message_id);
      if (layout.ok()) {
        for (const TensorMeta& meta : *layout) {
          torch::Tensor t;
          s = TorchCall(absl::StrCat(what, ": buffer ", meta.DebugString(), " for ", PeerName(peer),
                                     "'s payload"),
                        [&] { t = TakeBuffer(meta.dtype, WireShape(meta)); });
          if (s.ok()) s = RecvInto(t, peer, r.tag, what);
          if (s.ok()) {
            absl::StatusOr<torch::Tensor> whole = Assemble(std::move(t), meta, what);
            s = whole.status();
            if (s.ok()) t = *std::move(whole);
          }
          if (!s.ok()) break;
          if (meta.requires_grad && c10::isFloatingType(meta.dtype)) t.requires_grad_(true);
          out.push_back(std::move(t));
        }
      } else {
        s = layout.status();
      }
    }
  } else if (s.ok()) {
    for (size_t i = 0; s.ok() && i < r.works.size(); ++i) s = WaitRecv(r.works[i], peer, what);
    // The buffers' layouts: a gradient message holds only the sent tensors
    // that required grad.
    std::vector<const TensorMeta*> metas;
    for (const TensorMeta& meta : r.layout) {
      if (kind == Kind::kActivation || meta.requires_grad) metas.push_back(&meta);
    }
    for (size_t i = 0; s.ok() && i < r.buffers.size(); ++i) {
      absl::StatusOr<torch::Tensor> whole = Assemble(std::move(r.buffers[i]), *metas[i], what);
      s = whole.status();
      if (!s.ok()) break;
      torch::Tensor t = *std::move(whole);
      if (kind == Kind::kActivation && metas[i]->requires_grad &&
          c10::isFloatingType(metas[i]->dtype)) {
        t.requires_grad_(true);
      }
      out.push_back(std::move(t));
    }
  }
  if (!s.ok()) {
    AbortPostedReceives();
    return s;
  }
  queue.pop_front();
  s = AdvancePosts(queue);
  if (!s.ok()) {
    AbortPostedReceives();
    return s;
  }
  return out;
}

int P2P::posted_receives() const {
  int n = 0;
  for (const auto& [key, queue] : posted_) n += static_cast<int>(queue.size());
  return n;
}

void P2P::AbortPostedReceives() {
  for (auto& [key, queue] : posted_) {
    for (PostedRecv& r : queue) {
      std::vector<c10::intrusive_ptr<c10d::Work>> works = r.works;
      if (r.control_work) works.push_back(r.control_work);
      for (const c10::intrusive_ptr<c10d::Work>& work : works) {
        if (!work) continue;
        absl::Status s = TorchCall("abort a posted receive", [&] {
          if (!work->isCompleted()) work->abort();
        });
        if (!s.ok()) LOG(WARNING) << r.what << ": " << s;
      }
      ++stats_.posted_receives_aborted;
      aborted_.push_back(std::move(r));
    }
  }
  posted_.clear();
}

absl::Status P2P::SendGrads(int peer, int src_stage, int dst_stage, const Activations& grads,
                            const std::string& what) {
  PP_RETURN_IF_ERROR(ReapCompletedSends());
  PP_ASSIGN_OR_RETURN(const int tag, Tag(Kind::kGradient, src_stage, dst_stage));
  return PostPayload(grads, peer, tag, what);
}

absl::StatusOr<Activations> P2P::RecvGrads(int peer, int src_stage, int dst_stage,
                                           const std::vector<TensorMeta>& sent_layout,
                                           const std::string& what) {
  auto posted = posted_.find(PostKey{static_cast<int>(Kind::kGradient), src_stage, dst_stage});
  if (posted != posted_.end() && !posted->second.empty()) {
    return WaitPosted(Kind::kGradient, peer, src_stage, dst_stage, &sent_layout, what, nullptr);
  }
  PP_ASSIGN_OR_RETURN(const int tag, Tag(Kind::kGradient, src_stage, dst_stage));
  Activations grads;
  for (const TensorMeta& meta : sent_layout) {
    if (!meta.requires_grad) continue;
    torch::Tensor g = TakeBuffer(meta.dtype, WireShape(meta));
    PP_RETURN_IF_ERROR(RecvInto(g, peer, tag, what));
    PP_ASSIGN_OR_RETURN(g, Assemble(std::move(g), meta, what));
    grads.push_back(std::move(g));
  }
  return grads;
}

}  // namespace pp
