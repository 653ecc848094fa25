// P2P transfers on their own device streams, ordered with events.
//
// On an accelerator (a rank on cuda:<i>), P2P posts every send with a "send"
// stream current and every receive with a "receive" stream current, so c10d's
// NCCL backend (which makes its communication stream wait on the caller's
// current stream, and the caller's current stream on the receive's completion)
// orders the transfer against exactly these streams:
//
//   send:    compute stream --event--> send stream --(c10d)--> NCCL send
//            (the send waits for the kernels that produced the payload, and
//            only for them; later compute is not held up)
//   receive: compute stream --event--> receive stream, NCCL recv --(c10d,
//            Work::wait)--> receive stream --event--> compute stream (the
//            receive waits for the kernels queued before it, which may still
//            use the memory its buffer was given; kernels queued after
//            RecvActivations wait for the data on the device; the host does
//            not wait at all)
//
// so a stage's next compute overlaps its neighbour's activations arriving
// (once the compute queued before the receive has run).
// On the CPU every hook just runs the posting function (Gloo needs no
// streams). Only c10's device-generic stream/event interface is used: no CUDA
// API, so this compiles in every build.
//
// Posting order matters on NCCL: it matches point-to-point operations between
// two ranks by their order, not by tag (nccl_order.h checks the programs).
//
// Thread-compatible: used by the thread that owns the P2P.
#ifndef PIPELINE_RUNTIME_DEVICE_STREAMS_H_
#define PIPELINE_RUNTIME_DEVICE_STREAMS_H_

#include <cstdint>
#include <functional>
#include <optional>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "absl/status/status.h"

namespace pp {

class P2PStreams {
 public:
  // Streams from `device`'s pool when it is an accelerator; none on the CPU.
  explicit P2PStreams(c10::Device device);

  // True on an accelerator: sends are posted from the calling thread, in call
  // order (NCCL pairs operations by order), on the send stream.
  bool active() const { return send_.has_value(); }

  // Runs `post` (which calls ProcessGroup::send) with the send stream current,
  // after making the send stream wait for the work queued so far on the
  // calling thread's current (compute) stream.
  absl::Status Send(const std::function<absl::Status()>& post);

  // Makes the receive stream wait for the work queued so far on the calling
  // thread's current (compute) stream, runs `post` (which calls
  // ProcessGroup::recv and Work::wait) with the receive stream current, then
  // makes the compute stream wait for what was queued on the receive stream.
  absl::Status Recv(const std::function<absl::Status()>& post);

  // Counters for tests: how many sends/receives went through the streams.
  int64_t ordered_sends() const { return ordered_sends_; }
  int64_t ordered_receives() const { return ordered_receives_; }

 private:
  c10::Device device_;
  std::optional<c10::Stream> send_;
  std::optional<c10::Stream> recv_;
  int64_t ordered_sends_ = 0;
  int64_t ordered_receives_ = 0;
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_DEVICE_STREAMS_H_
