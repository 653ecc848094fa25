// Point-to-point transfer of Activations between pipeline stages over a c10d
// process group (Gloo on CPU, NCCL where LibTorch is CUDA-built).
//
// Wire protocol, per channel. A channel is (kind, source virtual stage,
// destination virtual stage); kind is "activation" (forward) or "gradient"
// (backward). Every message of a channel travels on its own Gloo tag, so
// messages of different channels between the same two ranks never match each
// other, and messages of one channel arrive in the order they were sent.
//
//   activation message, dynamic-shape mode (the default):
//     1. control: int64[kControlWords]  (always; 8 * 64 = 512 bytes)
//          word 0 = kSameHeader  -> the layout is the one of the last message
//                                   on this channel; nothing else follows
//          word 0 = kInlineHeader -> words 1.. hold the new header
//          word 0 = kHeaderFollows-> word 1 = header length L; then
//          word kFlagsWord = 1 if the sender uses static shapes, else 0 (a
//                                   receiver in the other mode fails at once)
//          word kIdWord (the last) = the message id (the micro-batch id the
//                                   payload belongs to; -1 if none)
//     2. header: int64[L]  (only for kHeaderFollows: huge tensor counts)
//     3. the tensors, one message each, in order (empty tensors are skipped)
//   header = [count, then per tensor: dtype, requires_grad, ndim, dims...]
//   (encoding and decoding, which trusts nothing it receives: p2p_wire.h)
//
//   activation message, static-shape mode (P2POptions::static_shapes;
//   DeepSpeed's pipeline engine sends the tensor meta on the first batch only):
//   in training passes, the first message of a channel goes as in
//   dynamic-shape mode (control + header), and both sides learn its layout;
//   every later training message of that channel is step 3 only (one Gloo message per tensor: the
//   message id is not transmitted, the receiver sees -1) and the receiver receives into the learned
//   layout. The sender compares every payload with the learned layout before it posts anything: a
//   different layout fails the send with InvalidArgument naming the channel, both layouts and the
//   option, so a size mismatch never reaches the transport and nothing is received into a wrong
//   layout. (The peer then waits for a payload that never comes: its receive ends with the timeout,
//   or when the launcher stops the job.) All ranks must use the same mode: the control word's
//   static-shapes flag lets a receiver in the other mode fail on the first message of a channel
//   (FailedPrecondition naming both modes), before any payload is misread.
//   Forward-only passes (SetForwardOnly: evaluation, sampling, whose
//   activations need no grad and whose windows may differ in shape) always go
//   as in dynamic-shape mode; they are rare next to training steps.
//
//   gradient message: only step 3, for exactly the tensors whose header said
//   requires_grad, in order. Its layout needs no header: the receiver is the
//   stage that sent the activations and knows their shapes (RecvGrads takes
//   them). Integer tensors never require grad; a float tensor that does not
//   require grad gets no gradient, and both sides agree on that through the
//   header flag, so nobody waits for a gradient that is never sent.
//
// Sends are asynchronous: each message is posted to the process group from
// the calling thread (c10d's send returns a Work at once; Gloo's transport
// thread moves the bytes), so messages of one channel are posted in call
// order, the tensor is kept alive until completion, two ranks that both send
// before they receive cannot deadlock, and WaitSends() joins everything with
// the timeout.
//
// The modes are the ones the product uses (dynamic shapes, and static shapes:
// parallelism.p2p_static_shapes). Two earlier modes were used only by tests
// and benchmarks and are gone: a fixed layout declared up front (ColossalAI's
// `tensor_shape`; static shapes learn the same layout from the first message
// and need no declaration) and a sender thread that posted sends (measured
// slower than posting from the compute thread: README "Performance", the
// sender thread's hand-off). Every wait has a timeout and its error names the
// peer rank and the action being executed.
//
// Receive buffers come from a pool keyed by dtype and size class, not shape:
// a message of n elements takes a flat buffer of P2PBufferCapacity(n)
// elements (n itself up to 16, else n rounded up to one of eight steps per
// octave, at most 1/8 more) and views its first n as the message's shape, so
// variable-length micro-batches reuse buffers instead of allocating one per
// shape, and the buffers a run allocates are bounded by the classes its
// sizes span times the receives outstanding at once. A received tensor
// belongs to the caller until it is handed back with Recycle(); a buffer whose
// storage is still referenced elsewhere is dropped instead of reused.
//
// Receives posted ahead of need (PostRecvActivations / PostRecvGrads): with
// Gloo's TCP transport a sender's bytes move only once the receiver has posted
// the matching receive, so a receive posted at the moment of need costs a
// round trip through both ranks' transport threads then. A posted receive
// goes into a per-channel queue; RecvActivations / RecvGrads on a channel
// with a posted receive wait for the oldest one (with the timeout) instead of
// posting. Posting in program order keeps channel order (Gloo matches the
// receives of one (peer, tag) in posting order). What is posted ahead:
//   - gradients: the payload (its layout is the sent activations' layout);
//   - activations in static-shape mode once the channel's layout is learned
//     (training passes): the payload, into pooled buffers;
//   - activations otherwise (dynamic-shape mode, or a channel's first static
//     message): only the control word; the header (if it follows) and the
//     payload are received when the receive is waited for, since their sizes
//     are known only then. Nothing later on that channel can be posted
//     before that payload (it would match the payload's messages), so a
//     channel's later receives are posted when its earlier ones complete.
// An error while waiting for a posted receive aborts every posted receive
// (AbortPostedReceives): channel order cannot be trusted after it. Aborted
// receives' buffers and Works are kept until the P2P object is destroyed, so
// bytes that still arrive never land in freed memory. On a device (NCCL)
// posting ahead does nothing: device receives are posted in program order on
// the receive stream and do not block the host (device_streams.h).
//
// Thread-compatible: one P2P object per rank, used by one thread.
#ifndef PIPELINE_RUNTIME_P2P_H_
#define PIPELINE_RUNTIME_P2P_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_context.h"
#include "pipeline/runtime/device_streams.h"
#include "pipeline/runtime/p2p_wire.h"

namespace pp {

// The elements of the pooled receive buffer a message of `numel` elements
// takes (see "Receive buffers" above).
int64_t P2PBufferCapacity(int64_t numel);

// The layout a payload is sent with: requires_grad is true exactly for
// floating-point tensors that require grad on the sender.
std::vector<TensorMeta> LayoutOf(const Activations& tensors);

struct P2POptions {
  // Every receive and send completion waits at most this long.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Static-shape mode (see the file comment): after the first message of a
  // channel in training passes, activations go as payload only, in the
  // learned layout.
  // Off: every activation message carries a 512-byte control message first.
  bool static_shapes = false;
  // Where receive buffers, control words and headers live: kCPU for Gloo; the
  // rank's CUDA device for NCCL (which moves only device tensors).
  torch::Device device = torch::kCPU;
  // Global rank of each group rank (the pipe group: index = stage), so that
  // errors name the peer as the launcher and the logs do ("global rank 2
  // (stage 1)"); empty: errors give group ranks.
  std::vector<int> global_ranks;
  // Megatron's scatter/gather between stages (scatter_gather_tensors_in_
  // pipeline): the ranks of this tensor-parallel model group send equal
  // floating-point payloads (tensor parallelism without sequence
  // parallelism: a stage's output is whole on every rank of its group), so
  // each sends only its part, 1/tp of the flat tensor (padded to a multiple
  // of tp), to its peer of the same model rank, and the receiving group
  // all-gathers the parts: the bytes crossing stages drop by tp for the
  // all-gather's inside the group. Activations and gradients alike; layouts
  // and headers still describe the whole tensors, integer tensors go whole.
  // A group of size 1 (the default) sends whole payloads. On the CPU only:
  // on a device every payload goes whole (the gather would have to wait for
  // the receive stream).
  ModelParallelGroup split_payloads_over;
};

// Counters, for tests and the benchmark.
struct P2PStats {
  int64_t control_messages = 0;
  int64_t header_messages = 0;  // headers sent (inline or separate)
  // Every message posted: payload tensors, control words and separate
  // headers (empty tensors are not sent).
  int64_t tensor_messages = 0;
  // Bytes of the activation and gradient payloads sent (control words and
  // headers not counted): halved by bf16 (TrainerOptions::precision).
  int64_t payload_bytes_sent = 0;
  // Activation messages sent as payload only under static_shapes.
  int64_t static_payloads = 0;
  int64_t buffers_allocated = 0;
  int64_t buffers_reused = 0;
  // Seconds the caller spent posting sends (inside the process group's
  // send()).
  double send_post_seconds = 0;
  // Receives posted ahead of need: payload tensors posted ahead, control
  // words posted ahead, and posted receives aborted.
  int64_t payloads_posted_ahead = 0;
  int64_t controls_posted_ahead = 0;
  int64_t posted_receives_aborted = 0;
  // Receives posted and not yet waited for, now (posted_receives()).
  int64_t receives_posted_now = 0;
};

// See the file comment. Owns nothing but a reference to the process group.
class P2P {
 public:
  // The control message's format (p2p_wire.h, where it is encoded and decoded).
  static constexpr int kControlWords = ::pp::kControlWords;
  static constexpr int64_t kSameHeader = static_cast<int64_t>(ControlKind::kSameHeader);
  static constexpr int64_t kInlineHeader = static_cast<int64_t>(ControlKind::kInlineHeader);
  static constexpr int64_t kHeaderFollows = static_cast<int64_t>(ControlKind::kHeaderFollows);
  static constexpr int kIdWord = ::pp::kIdWord;
  // Virtual stage ids must be below this (tags encode a stage pair).
  static constexpr int kMaxStages = 4096;

  // `group`: the process group whose ranks `peer` arguments refer to.
  P2P(c10::intrusive_ptr<c10d::ProcessGroup> group, P2POptions options);
  P2P(const P2P&) = delete;
  P2P& operator=(const P2P&) = delete;
  ~P2P();

  // Sends `tensors` from virtual stage `src_stage` to `dst_stage` on rank
  // `peer`. `what` names the action for error messages (e.g. "1SEND_F3").
  // `message_id` travels in the control word (dynamic-shape mode only).
  absl::Status SendActivations(int peer, int src_stage, int dst_stage, const Activations& tensors,
                               const std::string& what, int64_t message_id = -1);
  // Receives the payload that SendActivations(…, src_stage, dst_stage, …)
  // sent from rank `peer`. Tensors flagged requires_grad come back as leaves
  // that require grad. `*message_id` (if given) gets the sender's id, or -1
  // for a payload-only message (static shapes).
  absl::StatusOr<Activations> RecvActivations(int peer, int src_stage, int dst_stage,
                                              const std::string& what,
                                              int64_t* message_id = nullptr);

  // Sends the gradients of the activations `dst_stage` received from
  // `src_stage` back to `peer` (the rank of src_stage). `grads` holds one
  // tensor per activation flagged requires_grad, in order.
  absl::Status SendGrads(int peer, int src_stage, int dst_stage, const Activations& grads,
                         const std::string& what);
  // Receives on src_stage's rank what SendGrads sent. `sent_layout` is the
  // layout of the activations that were sent (LayoutOf(outputs)).
  absl::StatusOr<Activations> RecvGrads(int peer, int src_stage, int dst_stage,
                                        const std::vector<TensorMeta>& sent_layout,
                                        const std::string& what);

  // Posts the next activation receive of channel src_stage -> dst_stage from
  // `peer` now (see the file comment for what is posted); the matching
  // RecvActivations waits for it. Both must happen in the same pass (the
  // forward-only setting is taken at posting).
  absl::Status PostRecvActivations(int peer, int src_stage, int dst_stage, const std::string& what);
  // Posts the next gradient receive of the channel now, into pooled buffers
  // of `sent_layout`'s gradient tensors; the matching RecvGrads (with the same
  // layout) waits for it.
  absl::Status PostRecvGrads(int peer, int src_stage, int dst_stage,
                             const std::vector<TensorMeta>& sent_layout, const std::string& what);
  // Receives posted and not yet waited for, over all channels.
  int posted_receives() const;
  // Aborts every posted receive and forgets it (its buffers and Works are
  // kept until destruction, see the file comment). After a failed step.
  void AbortPostedReceives();

  // Waits for every outstanding send (with the timeout).
  absl::Status WaitSends();

  // Hands received tensors back to the buffer pool.
  void Recycle(Activations tensors);

  // Forgets every remembered header and learned static layout (both
  // directions) and every cached buffer. Both sides must call it at the same
  // point (e.g. between phases).
  void ResetShapes();

  // Whether the following activation messages belong to a forward-only pass
  // (evaluation, sampling). Static-shape mode applies to training passes
  // only: forward-only passes go as in dynamic-shape mode (their activations
  // do not require grad, and evaluation and sampling windows differ in
  // shape), without touching the learned layouts. Both sides must switch at
  // the same point of their programs (StageExecutor::Run does, from
  // LoweredProgram::forward_only).
  void SetForwardOnly(bool forward_only) { forward_only_ = forward_only; }

  P2PStats stats() const;
  const P2POptions& options() const { return options_; }
  // The device hooks (device_streams.h); inactive on the CPU.
  const P2PStreams& streams() const { return streams_; }
  int rank() const;

 private:
  enum class Kind : int { kActivation = 0, kGradient = 1 };
  using ChannelKey = std::tuple<int, int>;  // (src_stage, dst_stage)
  struct PendingSend {
    c10::intrusive_ptr<c10d::Work> work;
    int peer;
    std::string what;
  };
  // A receive posted ahead (see the file comment).
  struct PostedRecv {
    Kind kind = Kind::kActivation;
    int peer = 0;
    int src_stage = 0;
    int dst_stage = 0;
    int tag = 0;
    std::string what;
    bool forward_only = false;
    // Activations in dynamic-shape mode: the control word, once posted.
    torch::Tensor control;
    c10::intrusive_ptr<c10d::Work> control_work;
    // The payload, once posted (works[i] is null for an empty tensor).
    bool payload_posted = false;
    bool layout_known = false;
    std::vector<TensorMeta> layout;
    Activations buffers;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
  };
  using PostKey = std::tuple<int, int, int>;  // (kind, src_stage, dst_stage)
  // Queues a receive of `kind` on its channel and posts what can be posted
  // now; `layout` (gradients: the layout this stage sent) known up front or null.
  absl::Status PostAhead(Kind kind, int peer, int src_stage, int dst_stage,
                         const std::vector<TensorMeta>* layout, const std::string& what);
  // Posts what can be posted of the queue's receives, in order, stopping at
  // the first one whose payload cannot be posted yet.
  absl::Status AdvancePosts(std::deque<PostedRecv>& queue);
  absl::StatusOr<c10::intrusive_ptr<c10d::Work>> PostRecv(torch::Tensor& tensor, int peer, int tag,
                                                          const std::string& what);
  absl::Status WaitRecv(const c10::intrusive_ptr<c10d::Work>& work, int peer,
                        const std::string& what);
  // A receive wait's result as a Status: `wait` failed (timeout, peer gone)
  // or the Work was aborted (`what_from` + peer name + " was aborted").
  absl::Status RecvOutcome(const absl::Status& wait, bool completed, int peer,
                           const std::string& what_from) const;
  // The oldest posted receive of the channel, completed (payload received).
  absl::StatusOr<Activations> WaitPosted(Kind kind, int peer, int src_stage, int dst_stage,
                                         const std::vector<TensorMeta>* grad_layout,
                                         const std::string& what, int64_t* message_id);
  // Reads the layout an activation control word announces (and its header,
  // if one follows), remembering it as RecvActivations does.
  absl::StatusOr<std::vector<TensorMeta>> LayoutFromControl(torch::Tensor control, int peer,
                                                            int tag, int src_stage, int dst_stage,
                                                            const std::string& what,
                                                            int64_t* message_id);

  absl::StatusOr<int> Tag(Kind kind, int src_stage, int dst_stage) const;
  // "global rank G (stage P)" with P2POptions::global_ranks, else "rank P".
  std::string PeerName(int peer) const;
  absl::Status PostSend(torch::Tensor tensor, int peer, int tag, const std::string& what);
  // P2POptions::split_payloads_over: whether a tensor of `dtype` travels as
  // parts; the shape a receive buffer of `meta` takes; this rank's part of a
  // tensor to send; the whole put together from the group's received parts
  // (`part` goes back to the pool).
  bool SplitsPayload(c10::ScalarType dtype) const;
  std::vector<int64_t> WireShape(const TensorMeta& meta) const;
  torch::Tensor PartToSend(const torch::Tensor& tensor) const;
  absl::StatusOr<torch::Tensor> Assemble(torch::Tensor part, const TensorMeta& meta,
                                         const std::string& what);
  // Sends the payload tensors of a message (whole or as parts) and counts
  // their bytes.
  absl::Status PostPayload(const Activations& tensors, int peer, int tag, const std::string& what);
  absl::Status RecvInto(torch::Tensor& tensor, int peer, int tag, const std::string& what);
  torch::Tensor TakeBuffer(c10::ScalarType dtype, const std::vector<int64_t>& shape);
  absl::Status ReapCompletedSends();

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  P2POptions options_;
  P2PStreams streams_;
  std::map<ChannelKey, std::vector<TensorMeta>> sent_headers_;
  std::map<ChannelKey, std::vector<TensorMeta>> received_headers_;
  // Static-shape mode: the layouts learned from training passes.
  std::map<ChannelKey, std::vector<TensorMeta>> learned_sent_;
  std::map<ChannelKey, std::vector<TensorMeta>> learned_received_;
  bool forward_only_ = false;
  // Flat buffers by (dtype, capacity: P2PBufferCapacity).
  std::map<std::pair<int, int64_t>, std::vector<torch::Tensor>> pool_;
  P2PStats stats_;
  std::map<PostKey, std::deque<PostedRecv>> posted_;
  // Aborted receives' buffers and Works (see the file comment).
  std::vector<PostedRecv> aborted_;
  std::vector<PendingSend> in_flight_;  // posted, not yet known complete
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_P2P_H_
