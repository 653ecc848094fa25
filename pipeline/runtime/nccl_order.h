// Whether a lowered program can run its point-to-point transfers on NCCL.
//
// Gloo matches a receive with the send of the same tag, so p2p.h gives every
// channel its own tag and any posting order works. NCCL ignores tags: c10d's
// NCCL backend runs the operations between two ranks on one communicator and
// one stream per pair, matched strictly in posting order, and an operation
// blocks its stream until the peer's matching one runs. So on a device, the
// k-th transfer rank a posts towards rank b must be the counterpart of the
// k-th transfer b posts towards a (same channel and micro-batch, send against
// receive), for every pair. P2P posts in program order (device sends go out
// from the calling thread, device_streams.h), so this is a property of the
// program as executed (DeferReceives applied when the executor defers).
//
// Transfers between virtual stages of one rank never reach the process group
// and are ignored. Programs of pipe's registered schedules that fail this
// check would need batched send/recv (ncclGroupStart/End: c10d's
// startCoalescing/endCoalescing) for the operations of one step; the Trainer
// refuses them on a device instead of hanging (nccl_order_test lists which).
#ifndef PIPELINE_RUNTIME_NCCL_ORDER_H_
#define PIPELINE_RUNTIME_NCCL_ORDER_H_

#include "absl/status/status.h"
#include "pipeline/schedule/ir/lowering.h"

namespace pp {

// OK when every pair of ranks posts matching transfers in matching order;
// FailedPrecondition naming the schedule, the two ranks and the first pair of
// actions that do not match (or the action left without a counterpart).
absl::Status CheckPairwiseP2POrder(const LoweredProgram& program);

}  // namespace pp

#endif  // PIPELINE_RUNTIME_NCCL_ORDER_H_
