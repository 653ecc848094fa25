#include "pipeline/runtime/p2p.h"

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/status_macros.h"
#include "pipeline/runtime/model_parallel_group.h"
#include "pipeline/tensor_parallel/planted_fault.h"
#include "topology/device.h"
#include "topology/parallel_grid.h"
#include "topology/process_topology.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

using std::chrono::milliseconds;

#define ASSERT_OK(expr) ASSERT_TRUE((expr).ok()) << (expr)
#define EXPECT_STATUS_OK(s)       \
  do {                            \
    absl::Status st_ = (s);       \
    EXPECT_TRUE(st_.ok()) << st_; \
  } while (false)

absl::Status Check(bool cond, const std::string& what) {
  return cond ? absl::OkStatus() : absl::InternalError(what);
}

TEST(P2PHeaderTest, RoundTrips) {
  std::vector<TensorMeta> layout = {
      {torch::kFloat, {2, 3}, true}, {torch::kLong, {2}, false}, {torch::kBool, {}, false}};
  auto decoded = DecodeHeader(EncodeHeader(layout));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, layout);
}

TEST(P2PHeaderTest, RejectsCorruptHeader) {
  EXPECT_FALSE(DecodeHeader({}).ok());
  EXPECT_FALSE(DecodeHeader({1, 6, 0}).ok());        // truncated
  EXPECT_FALSE(DecodeHeader({1, 9999, 0, 0}).ok());  // bad dtype
}

TEST(P2PTest, LayoutMarksOnlyFloatsThatRequireGrad) {
  Activations a = {torch::ones({2}, torch::requires_grad()), torch::ones({2}),
                   torch::ones({2}, torch::kLong)};
  std::vector<TensorMeta> l = LayoutOf(a);
  EXPECT_TRUE(l[0].requires_grad);
  EXPECT_FALSE(l[1].requires_grad);
  EXPECT_FALSE(l[2].requires_grad);
}

// A float activation that requires grad, an integer mask and a float without
// grad travel together; only the first gets a gradient back, and nobody hangs.
TEST(P2PTest, MultiTensorPayloadWithMaskAndNoGradFloat) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
    P2P p2p(world.group, P2POptions{milliseconds(20000)});
    if (world.rank == 0) {
      torch::Tensor w = torch::full({3}, 2.0, torch::requires_grad());
      torch::Tensor x = torch::arange(6, torch::kFloat).reshape({2, 3}) * w;
      torch::Tensor mask = torch::tensor({1, 0}, torch::kLong);
      torch::Tensor nograd = torch::full({4}, 7.0);
      Activations sent = {x, mask, nograd};
      PP_RETURN_IF_ERROR(p2p.SendActivations(1, 0, 1, sent, "0SEND_F0"));
      PP_ASSIGN_OR_RETURN(Activations grads, p2p.RecvGrads(1, 0, 1, LayoutOf(sent), "0RECV_B0"));
      PP_RETURN_IF_ERROR(Check(grads.size() == 1, "one grad expected"));
      PP_RETURN_IF_ERROR(Check(torch::equal(grads[0], torch::full({2, 3}, 3.0)), "grad value"));
      torch::autograd::backward({x}, {grads[0]});
      PP_RETURN_IF_ERROR(Check(torch::allclose(w.grad(), torch::tensor({9.0f, 15.0f, 21.0f})),
                               "weight grad after backward"));
    } else {
      PP_ASSIGN_OR_RETURN(Activations got, p2p.RecvActivations(0, 0, 1, "1RECV_F0"));
      PP_RETURN_IF_ERROR(Check(got.size() == 3, "three tensors"));
      PP_RETURN_IF_ERROR(
          Check(got[0].requires_grad() && !got[1].requires_grad() && !got[2].requires_grad(),
                "requires_grad flags"));
      PP_RETURN_IF_ERROR(Check(got[1].scalar_type() == torch::kLong &&
                                   torch::equal(got[1], torch::tensor({1, 0}, torch::kLong)),
                               "mask"));
      PP_RETURN_IF_ERROR(Check(torch::equal(got[2], torch::full({4}, 7.0)), "no-grad float"));
      torch::Tensor y = (got[0] * 3.0).sum() + got[2].sum();
      y.backward();
      PP_RETURN_IF_ERROR(p2p.SendGrads(0, 0, 1, {got[0].grad()}, "1SEND_B0"));
    }
    return p2p.WaitSends();
  });
  EXPECT_STATUS_OK(s);
}

// The header goes once per (channel, layout): a second message with the same
// layout sends only the control word; a new shape sends a new header; receive
// buffers of a recycled dtype+shape are reused.
TEST(P2PTest, HeaderOnlyOnLayoutChangeAndBuffersReused) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
    P2P p2p(world.group, P2POptions{milliseconds(20000)});
    std::vector<std::vector<int64_t>> shapes = {{2, 3}, {2, 3}, {4, 3}, {2, 3}, {4, 3}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (world.rank == 0) {
        PP_RETURN_IF_ERROR(
            p2p.SendActivations(1, 0, 1, {torch::full(shapes[i], float(i))}, "send", 100 + i));
      } else {
        int64_t id = -2;
        PP_ASSIGN_OR_RETURN(Activations got, p2p.RecvActivations(0, 0, 1, "recv", &id));
        PP_RETURN_IF_ERROR(Check(id == static_cast<int64_t>(100 + i), "message id carried"));
        PP_RETURN_IF_ERROR(Check(got[0].sizes().vec() == shapes[i], "shape"));
        PP_RETURN_IF_ERROR(Check(torch::equal(got[0], torch::full(shapes[i], float(i))), "value"));
        p2p.Recycle(std::move(got));
      }
    }
    PP_RETURN_IF_ERROR(p2p.WaitSends());
    if (world.rank == 0) {
      PP_RETURN_IF_ERROR(Check(p2p.stats().control_messages == 5, "5 control messages"));
      PP_RETURN_IF_ERROR(Check(p2p.stats().header_messages == 4,
                               "headers for layouts 0, 2, 3, 4 (changes), not 1: got " +
                                   std::to_string(p2p.stats().header_messages)));
    } else {
      PP_RETURN_IF_ERROR(Check(
          p2p.stats().buffers_allocated == 2,
          "two buffer shapes allocated: got " + std::to_string(p2p.stats().buffers_allocated)));
      PP_RETURN_IF_ERROR(Check(p2p.stats().buffers_reused == 3, "three reuses"));
    }
    return absl::OkStatus();
  });
  EXPECT_STATUS_OK(s);
}

// Receive buffers are pooled by size class, not shape: a thousand messages
// of random [rows, length, 8] shapes allocate one buffer per class their
// sizes fall in (one message outstanding at a time), never one per shape.
TEST(P2PTest, VariableShapesReuseBuffersBySizeClass) {
  EXPECT_EQ(P2PBufferCapacity(7), 7);
  EXPECT_EQ(P2PBufferCapacity(16), 16);
  EXPECT_EQ(P2PBufferCapacity(17), 18);
  EXPECT_EQ(P2PBufferCapacity(1000), 1024);
  for (int64_t n = 1; n < 5000; ++n) {
    const int64_t c = P2PBufferCapacity(n);
    ASSERT_GE(c, n);
    ASSERT_LE(c, n + n / 8 + 1);
    ASSERT_EQ(P2PBufferCapacity(c), c) << n;
  }
  constexpr int kMessages = 1000;
  std::vector<std::vector<int64_t>> shapes;
  std::set<int64_t> classes;
  std::set<std::vector<int64_t>> distinct;
  torch::Generator gen = at::detail::createCPUGenerator(5);
  for (int i = 0; i < kMessages; ++i) {
    const int64_t rows = 1 + torch::randint(4, {1}, gen, torch::kLong).item<int64_t>();
    const int64_t length = 1 + torch::randint(64, {1}, gen, torch::kLong).item<int64_t>();
    shapes.push_back({rows, length, 8});
    classes.insert(P2PBufferCapacity(rows * length * 8));
    distinct.insert(shapes.back());
  }
  ASSERT_GT(distinct.size(), 2 * classes.size());
  absl::Status s = RunOnThreadRanks(2, milliseconds(60000), [&](World& world) -> absl::Status {
    P2P p2p(world.group, P2POptions{milliseconds(20000)});
    for (int i = 0; i < kMessages; ++i) {
      if (world.rank == 0) {
        PP_RETURN_IF_ERROR(
            p2p.SendActivations(1, 0, 1, {torch::full(shapes[i], float(i))}, "send"));
      } else {
        PP_ASSIGN_OR_RETURN(Activations got, p2p.RecvActivations(0, 0, 1, "recv"));
        PP_RETURN_IF_ERROR(Check(got[0].sizes().vec() == shapes[i], "shape"));
        PP_RETURN_IF_ERROR(Check(torch::equal(got[0], torch::full(shapes[i], float(i))), "value"));
        p2p.Recycle(std::move(got));
      }
    }
    PP_RETURN_IF_ERROR(p2p.WaitSends());
    if (world.rank == 1) {
      PP_RETURN_IF_ERROR(
          Check(p2p.stats().buffers_allocated == static_cast<int64_t>(classes.size()),
                "one buffer per size class: " + std::to_string(p2p.stats().buffers_allocated) +
                    " allocated, " + std::to_string(classes.size()) + " classes"));
    }
    return absl::OkStatus();
  });
  EXPECT_STATUS_OK(s);
}

P2POptions StaticShapes() {
  P2POptions options{milliseconds(20000)};
  options.static_shapes = true;
  return options;
}

// Static-shape mode: the first activation of a channel carries control word
// and header, every later one is the payload only (one message per tensor),
// received into the learned layout, requires_grad flag included. Messages of
// a forward-only pass (no grad, other shapes) carry control words as in
// dynamic mode, and training resumes payload-only without a new header.
TEST(P2PTest, StaticShapesSendOneMessagePerActivationAfterTheFirst) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
    P2P p2p(world.group, StaticShapes());
    struct Message {
      bool forward_only;
      std::vector<int64_t> shape;
    };
    const std::vector<Message> messages = {{false, {2, 3}}, {false, {2, 3}}, {false, {2, 3}},
                                           {true, {5, 3}},  {true, {1, 3}},  {false, {2, 3}},
                                           {false, {2, 3}}};
    for (size_t i = 0; i < messages.size(); ++i) {
      const Message& m = messages[i];
      p2p.SetForwardOnly(m.forward_only);
      const P2PStats before = p2p.stats();
      if (world.rank == 0) {
        torch::Tensor x = torch::full(m.shape, float(i));
        if (!m.forward_only) x.requires_grad_(true);
        PP_RETURN_IF_ERROR(p2p.SendActivations(1, 0, 1, {x}, "send", 100 + i));
        const P2PStats after = p2p.stats();
        // With a control word: the first training message, forward-only ones.
        const bool first = i == 0 || m.forward_only;
        const int64_t posted = after.tensor_messages - before.tensor_messages;
        PP_RETURN_IF_ERROR(Check(posted == (first ? 2 : 1),
                                 "message " + std::to_string(i) + ": " + std::to_string(posted) +
                                     " messages posted; want " + (first ? "2" : "1")));
        PP_RETURN_IF_ERROR(
            Check(after.control_messages - before.control_messages == (first ? 1 : 0),
                  "control word only on the first training message"));
        PP_RETURN_IF_ERROR(Check(after.static_payloads - before.static_payloads == (first ? 0 : 1),
                                 "payload-only count"));
      } else {
        int64_t id = -2;
        PP_ASSIGN_OR_RETURN(Activations got, p2p.RecvActivations(0, 0, 1, "recv", &id));
        const bool first = i == 0 || m.forward_only;
        PP_RETURN_IF_ERROR(Check(id == (first ? static_cast<int64_t>(100 + i) : -1),
                                 "message id with control words only: got " + std::to_string(id)));
        PP_RETURN_IF_ERROR(Check(got.size() == 1 && got[0].sizes().vec() == m.shape, "shape"));
        PP_RETURN_IF_ERROR(Check(torch::equal(got[0].detach(), torch::full(m.shape, float(i))),
                                 "value of message " + std::to_string(i)));
        PP_RETURN_IF_ERROR(Check(got[0].requires_grad() == !m.forward_only,
                                 "requires_grad of message " + std::to_string(i)));
        PP_RETURN_IF_ERROR(Check(p2p.stats().control_messages == 0, "receiver sends nothing"));
        p2p.Recycle(std::move(got));
      }
    }
    if (world.rank == 0) {
      PP_RETURN_IF_ERROR(
          Check(p2p.stats().tensor_messages == 10 && p2p.stats().header_messages == 3,
                "7 payloads + 3 control words, 3 headers: got " +
                    std::to_string(p2p.stats().tensor_messages) + " messages"));
    }
    return p2p.WaitSends();
  });
  EXPECT_STATUS_OK(s);
}

// A payload whose layout differs from the channel's learned one (shape, or
// only the requires_grad flag) fails before anything is posted, naming the
// channel, both layouts and the option; the channel then still works (the
// receiver gets the next good payload, not bytes of the refused one).
TEST(P2PTest, StaticShapesLayoutChangeFailsNamingChannelLayoutsAndOption) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
    P2P p2p(world.group, StaticShapes());
    if (world.rank == 0) {
      PP_RETURN_IF_ERROR(p2p.SendActivations(1, 0, 1, {torch::full({2, 3}, 1.0f)}, "0SEND_F0"));
      const int64_t posted = p2p.stats().tensor_messages;
      absl::Status bigger = p2p.SendActivations(1, 0, 1, {torch::zeros({4, 3})}, "0SEND_F1");
      const std::string m(bigger.message());
      PP_RETURN_IF_ERROR(Check(bigger.code() == absl::StatusCode::kInvalidArgument, m));
      for (const char* part : {"0SEND_F1", "stage 0 -> stage 1", "Float[2,3]", "Float[4,3]",
                               "p2p_static_shapes", "nothing was sent"}) {
        PP_RETURN_IF_ERROR(Check(m.find(part) != std::string::npos,
                                 std::string("error lacks '") + part + "': " + m));
      }
      absl::Status grad =
          p2p.SendActivations(1, 0, 1, {torch::zeros({2, 3}, torch::requires_grad())}, "0SEND_F2");
      PP_RETURN_IF_ERROR(
          Check(grad.code() == absl::StatusCode::kInvalidArgument &&
                    std::string(grad.message()).find("Float[2,3](grad)") != std::string::npos,
                "a requires_grad change is a layout change: " + grad.ToString()));
      PP_RETURN_IF_ERROR(
          Check(p2p.stats().tensor_messages == posted, "refused sends posted nothing"));
      PP_RETURN_IF_ERROR(p2p.SendActivations(1, 0, 1, {torch::full({2, 3}, 3.0f)}, "0SEND_F3"));
    } else {
      for (float want : {1.0f, 3.0f}) {
        PP_ASSIGN_OR_RETURN(Activations got, p2p.RecvActivations(0, 0, 1, "1RECV_F"));
        PP_RETURN_IF_ERROR(
            Check(torch::equal(got[0], torch::full({2, 3}, want)), "value after a refused send"));
      }
    }
    return p2p.WaitSends();
  });
  EXPECT_STATUS_OK(s);
}

// Ranks in different modes: the receiver fails on the channel's first
// message, naming both settings, whichever side has the mode on.
TEST(P2PTest, StaticShapesModeMismatchBetweenPeersFailsOnTheFirstMessage) {
  for (int static_rank : {0, 1}) {
    absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [&](World& world) -> absl::Status {
      P2POptions options{milliseconds(1000)};
      options.static_shapes = world.rank == static_rank;
      P2P p2p(world.group, options);
      if (world.rank == 0) {
        PP_RETURN_IF_ERROR(p2p.SendActivations(1, 0, 1, {torch::ones({2, 3})}, "0SEND_F0"));
        // The receiver stopped at the control word: the payload is never
        // taken, and the send ends with the timeout.
        absl::Status sent = p2p.WaitSends();
        return AfterAllRanks(world, "sender timed out",
                             Check(sent.code() == absl::StatusCode::kDeadlineExceeded,
                                   "payload send: " + sent.ToString()));
      }
      absl::StatusOr<Activations> got = p2p.RecvActivations(0, 0, 1, "1RECV_F0");
      const std::string want = static_rank == 0 ? "static p2p shapes on but this rank has them off"
                                                : "static p2p shapes off but this rank has them on";
      // Stay alive until the sender's send has timed out (a closed pair
      // would fail it early).
      return AfterAllRanks(
          world, "sender timed out",
          Check(got.status().code() == absl::StatusCode::kFailedPrecondition &&
                    std::string(got.status().message()).find(want) != std::string::npos &&
                    std::string(got.status().message()).find("p2p_static_shapes") !=
                        std::string::npos,
                "mode mismatch: " + got.status().ToString()));
    });
    EXPECT_STATUS_OK(s);
  }
}

// Both ranks send before they receive: asynchronous sends keep this from
// deadlocking.
TEST(P2PTest, SimultaneousSendsDoNotDeadlock) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
    P2P p2p(world.group, P2POptions{milliseconds(20000)});
    const int peer = 1 - world.rank;
    PP_RETURN_IF_ERROR(p2p.SendActivations(peer, world.rank, peer,
                                           {torch::full({1000}, float(world.rank))}, "send"));
    PP_ASSIGN_OR_RETURN(Activations got, p2p.RecvActivations(peer, peer, world.rank, "recv"));
    PP_RETURN_IF_ERROR(Check(torch::equal(got[0], torch::full({1000}, float(peer))), "value"));
    return p2p.WaitSends();
  });
  EXPECT_STATUS_OK(s);
}

// Many messages on two channels in both directions, every send posted before
// the peer receives: each channel delivers in order.
TEST(P2PTest, SendsKeepChannelOrderWithoutDeadlock) {
  {
    absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
      P2P p2p(world.group, P2POptions{milliseconds(20000)});
      const int peer = 1 - world.rank;
      constexpr int kMessages = 12;
      for (int i = 0; i < kMessages; ++i) {
        // Activations on (rank -> peer) and gradients back on the peer's
        // activation channel, sizes from 1 float to 64 KiB.
        const int64_t n = int64_t{1} << (i % 15);
        PP_RETURN_IF_ERROR(p2p.SendActivations(
            peer, world.rank, peer, {torch::full({n}, float(100 * world.rank + i))}, "send"));
        PP_RETURN_IF_ERROR(
            p2p.SendGrads(peer, peer, world.rank, {torch::full({n}, float(-i))}, "grads"));
      }
      for (int i = 0; i < kMessages; ++i) {
        const int64_t n = int64_t{1} << (i % 15);
        PP_ASSIGN_OR_RETURN(Activations got, p2p.RecvActivations(peer, peer, world.rank, "recv"));
        PP_RETURN_IF_ERROR(Check(torch::equal(got[0], torch::full({n}, float(100 * peer + i))),
                                 "activation " + std::to_string(i) + " in order"));
        TensorMeta meta{torch::kFloat, {n}, true};
        PP_ASSIGN_OR_RETURN(Activations g, p2p.RecvGrads(peer, world.rank, peer, {meta}, "recv_g"));
        PP_RETURN_IF_ERROR(Check(torch::equal(g[0], torch::full({n}, float(-i))),
                                 "gradient " + std::to_string(i) + " in order"));
      }
      PP_RETURN_IF_ERROR(p2p.WaitSends());
      const P2PStats stats = p2p.stats();
      PP_RETURN_IF_ERROR(Check(stats.tensor_messages == 3 * kMessages,
                               "control + activation + gradient per round: got " +
                                   std::to_string(stats.tensor_messages)));
      PP_RETURN_IF_ERROR(Check(stats.send_post_seconds > 0, "posting is timed"));
      return absl::OkStatus();
    });
    EXPECT_STATUS_OK(s);
  }
}

// A silent peer: the receive times out with an error naming the peer rank and
// the action.
TEST(P2PTest, SilentPeerTimesOutNamingPeerAndAction) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
    P2P p2p(world.group, P2POptions{milliseconds(500)});
    if (world.rank == 0) {
      // Stay alive and silent until the peer has timed out (a timed-out
      // Gloo pair is closed, so no collective can follow; the store can).
      return AfterAllRanks(world, "receiver timed out");
    }
    return AfterAllRanks(world, "receiver timed out", [&]() -> absl::Status {
      auto got = p2p.RecvActivations(0, 0, 1, "1RECV_F4");
      PP_RETURN_IF_ERROR(Check(!got.ok(), "must fail"));
      const std::string msg(got.status().message());
      PP_RETURN_IF_ERROR(Check(msg.find("1RECV_F4") != std::string::npos, "names action: " + msg));
      return Check(msg.find("rank 0") != std::string::npos, "names peer: " + msg);
    }());
  });
  EXPECT_STATUS_OK(s);
}

// With dp > 1 the pipe group's rank is the stage, not the global rank the
// launcher names: errors give both.
TEST(P2PTest, TimeoutNamesThePeersGlobalRankAndStage) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
    P2POptions options{milliseconds(500)};
    options.global_ranks = {2, 3};  // e.g. data-parallel replica 1 of pp 2 x dp 2
    P2P p2p(world.group, options);
    if (world.rank == 0) return AfterAllRanks(world, "receiver timed out");
    return AfterAllRanks(world, "receiver timed out", [&]() -> absl::Status {
      auto got = p2p.RecvActivations(0, 0, 1, "1RECV_F0");
      PP_RETURN_IF_ERROR(Check(!got.ok(), "must fail"));
      const std::string msg(got.status().message());
      PP_RETURN_IF_ERROR(
          Check(msg.find("receive from global rank 2 (stage 0)") != std::string::npos,
                "names the global rank: " + msg));
      return Check(msg.find("(peer global rank 2 (stage 0) died") != std::string::npos,
                   "names the peer: " + msg);
    }());
  });
  EXPECT_STATUS_OK(s);
}

enum class Mode { kDynamic, kStatic };

P2POptions OptionsFor(Mode mode, milliseconds timeout) {
  P2POptions options{timeout};
  if (mode == Mode::kStatic) options.static_shapes = true;
  return options;
}

const char* ModeName(Mode mode) { return mode == Mode::kDynamic ? "dynamic" : "static"; }

// Receives posted ahead, several per channel on two channels, and gradients
// posted ahead: every wait gets its channel's messages in order, with the
// same values, ids and requires_grad flags as a plain receive, in each
// activation mode; what was posted ahead is counted, and nothing stays posted.
TEST(P2PPostAheadTest, PostedReceivesKeepChannelOrderInEveryMode) {
  for (Mode mode : {Mode::kDynamic, Mode::kStatic}) {
    SCOPED_TRACE(ModeName(mode));
    absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [mode](World& world) -> absl::Status {
      P2P p2p(world.group, OptionsFor(mode, milliseconds(20000)));
      constexpr int kMessages = 4;
      const std::vector<int> sources = {0, 2};  // two channels: stage 0 -> 1, 2 -> 1
      if (world.rank == 0) {
        // Gradients posted before the activations go out.
        const std::vector<TensorMeta> layout = {{torch::kFloat, {2, 3}, true}};
        for (int i = 0; i < kMessages; ++i) {
          PP_RETURN_IF_ERROR(p2p.PostRecvGrads(1, 0, 1, layout, "0RECV_B" + std::to_string(i)));
        }
        PP_RETURN_IF_ERROR(Check(p2p.posted_receives() == kMessages, "4 gradients posted"));
        for (int i = 0; i < kMessages; ++i) {
          for (int src : sources) {
            torch::Tensor x = torch::full({2, 3}, float(10 * src + i), torch::requires_grad());
            PP_RETURN_IF_ERROR(p2p.SendActivations(1, src, 1, {x}, "0SEND_F", 100 * src + i));
          }
        }
        for (int i = 0; i < kMessages; ++i) {
          PP_ASSIGN_OR_RETURN(Activations g, p2p.RecvGrads(1, 0, 1, layout, "0RECV_B"));
          PP_RETURN_IF_ERROR(Check(g.size() == 1 && torch::equal(g[0], torch::full({2, 3}, -i)),
                                   "gradient " + std::to_string(i) + " in order"));
        }
        PP_RETURN_IF_ERROR(Check(p2p.stats().payloads_posted_ahead == kMessages,
                                 "gradient payloads posted ahead: " +
                                     std::to_string(p2p.stats().payloads_posted_ahead)));
      } else {
        for (int i = 0; i < kMessages; ++i) {
          for (int src : sources) {
            PP_RETURN_IF_ERROR(p2p.PostRecvActivations(0, src, 1, "1RECV_F" + std::to_string(i)));
          }
        }
        PP_RETURN_IF_ERROR(Check(p2p.posted_receives() == 2 * kMessages, "8 posted"));
        for (int i = 0; i < kMessages; ++i) {
          for (int src : sources) {
            int64_t id = -2;
            PP_ASSIGN_OR_RETURN(Activations got, p2p.RecvActivations(0, src, 1, "1RECV_F", &id));
            const std::string m =
                "channel " + std::to_string(src) + " message " + std::to_string(i);
            PP_RETURN_IF_ERROR(
                Check(got.size() == 1 && got[0].requires_grad() &&
                          torch::equal(got[0].detach(), torch::full({2, 3}, float(10 * src + i))),
                      m + ": value in order"));
            const bool has_id = mode == Mode::kDynamic || (mode == Mode::kStatic && i == 0);
            PP_RETURN_IF_ERROR(
                Check(id == (has_id ? 100 * src + i : -1), m + ": id " + std::to_string(id)));
            p2p.Recycle(std::move(got));
          }
        }
        const P2PStats stats = p2p.stats();
        // Dynamic: a control word per message ahead, payloads when waited.
        // Static: the first message's control word, every later payload.
        const int64_t want_controls = mode == Mode::kDynamic ? 2 * kMessages : 2;
        const int64_t want_payloads = mode == Mode::kDynamic ? 0 : 2 * (kMessages - 1);
        PP_RETURN_IF_ERROR(Check(stats.controls_posted_ahead == want_controls &&
                                     stats.payloads_posted_ahead == want_payloads,
                                 "posted ahead: " + std::to_string(stats.controls_posted_ahead) +
                                     " control words, " +
                                     std::to_string(stats.payloads_posted_ahead) + " payloads"));
        for (int i = 0; i < kMessages; ++i) {
          PP_RETURN_IF_ERROR(p2p.SendGrads(0, 0, 1, {torch::full({2, 3}, float(-i))}, "1SEND_B"));
        }
      }
      PP_RETURN_IF_ERROR(Check(p2p.posted_receives() == 0, "nothing left posted"));
      PP_RETURN_IF_ERROR(Check(p2p.stats().posted_receives_aborted == 0, "nothing aborted"));
      return p2p.WaitSends();
    });
    EXPECT_STATUS_OK(s);
  }
}

// Megatron's scatter/gather (P2POptions::split_payloads_over): pp 2 x tp 2,
// each model group's ranks holding equal tensors. Each rank sends half of a
// float activation of 15 elements (8, the last part padded) and its int mask
// whole; the receiving group gathers the whole activation back (requires
// grad), and the gradients travel back the same way. In each activation
// mode, with receives posted ahead and not, 2 messages per channel; with
// the planted wrong part (each rank sends its neighbour's) the whole comes
// back permuted.
TEST(P2PSplitPayloadTest, ModelGroupsSendTheirPartsAndGatherTheWhole) {
  namespace tp_internal = tensor_parallel::internal;
  for (const bool planted : {false, true}) {
    for (Mode mode : {Mode::kDynamic, Mode::kStatic}) {
      for (const bool ahead : {false, true}) {
        if (planted && (mode == Mode::kStatic || ahead)) continue;
        SCOPED_TRACE(std::string(ModeName(mode)) + (ahead ? ", posted ahead" : "") +
                     (planted ? ", planted wrong part" : ""));
        const tp_internal::PlantedFault previous =
            tp_internal::PlantFault(planted ? tp_internal::PlantedFault::kWrongPayloadPart
                                            : tp_internal::PlantedFault::kNone);
        absl::Status s =
            RunOnThreadRanks(4, milliseconds(20000), [&](World& world) -> absl::Status {
              PP_ASSIGN_OR_RETURN(ProcessTopology topology, PipeModelDataParallelTopology(2, 2, 1));
              PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, topology));
              P2POptions options = OptionsFor(mode, milliseconds(20000));
              options.split_payloads_over = ModelParallelGroupOf(grid, milliseconds(20000));
              P2P p2p(grid.pipe_group(), options);
              const torch::Tensor x = torch::arange(15, torch::kFloat).reshape({3, 5});
              const torch::Tensor mask = torch::tensor({1, 0, 1}, torch::kLong);
              const std::vector<TensorMeta> layout = {{torch::kFloat, {3, 5}, true},
                                                      {torch::kLong, {3}, false}};
              for (int i = 0; i < 2; ++i) {
                const std::string m = "message " + std::to_string(i);
                if (grid.stage_id() == 0) {
                  if (ahead) PP_RETURN_IF_ERROR(p2p.PostRecvGrads(1, 0, 1, layout, "0RECV_B"));
                  torch::Tensor sent = (x + i).requires_grad_(true);
                  PP_RETURN_IF_ERROR(p2p.SendActivations(1, 0, 1, {sent, mask}, "0SEND_F"));
                  if (planted) break;
                  PP_ASSIGN_OR_RETURN(Activations g, p2p.RecvGrads(1, 0, 1, layout, "0RECV_B"));
                  PP_RETURN_IF_ERROR(Check(
                      g.size() == 1 && g[0].sizes() == x.sizes() && torch::equal(g[0], -x - i),
                      m + ": the gradient, whole"));
                } else {
                  if (ahead) PP_RETURN_IF_ERROR(p2p.PostRecvActivations(0, 0, 1, "1RECV_F"));
                  PP_ASSIGN_OR_RETURN(Activations got, p2p.RecvActivations(0, 0, 1, "1RECV_F"));
                  PP_RETURN_IF_ERROR(
                      Check(got.size() == 2 && got[0].requires_grad() && torch::equal(got[1], mask),
                            m + ": layout"));
                  if (planted) {
                    PP_RETURN_IF_ERROR(Check(!torch::equal(got[0].detach(), x + i),
                                             m + ": a wrong part went unnoticed"));
                    break;
                  }
                  PP_RETURN_IF_ERROR(
                      Check(torch::equal(got[0].detach(), x + i), m + ": the activation, whole"));
                  PP_RETURN_IF_ERROR(p2p.SendGrads(0, 0, 1, {-x - i}, "1SEND_B"));
                }
              }
              // 8 of 15 floats (the last part padded) and the mask's 3 longs
              // per activation; 8 floats per gradient.
              const int64_t want = planted                ? (grid.stage_id() == 0 ? 32 + 24 : 0)
                                   : grid.stage_id() == 0 ? 2 * (32 + 24)
                                                          : 2 * 32;
              PP_RETURN_IF_ERROR(
                  Check(p2p.stats().payload_bytes_sent == want,
                        "payload bytes " + std::to_string(p2p.stats().payload_bytes_sent)));
              return p2p.WaitSends();
            });
        tp_internal::PlantFault(previous);
        EXPECT_STATUS_OK(s);
      }
    }
  }
}

// What posting ahead is for: a payload receive posted ahead (a gradient:
// its layout is known) lets the sender's transfer complete before the
// receiver waits (Gloo's TCP transport moves the bytes once the receive is
// posted). The sender's WaitSends returns while the receiver is still waiting
// for the sender's signal; without the posted receive it would time out.
TEST(P2PPostAheadTest, PostedPayloadCompletesTheSendBeforeTheWait) {
  std::atomic<bool> sent{false};
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [&sent](World& world) -> absl::Status {
    P2P p2p(world.group, OptionsFor(Mode::kDynamic, milliseconds(10000)));
    const std::vector<TensorMeta> layout = {{torch::kFloat, {2, 3}, true}};
    if (world.rank == 0) {
      absl::Status s = p2p.SendGrads(1, 1, 2, {torch::ones({2, 3})}, "2SEND_B0");
      if (s.ok()) s = p2p.WaitSends();
      sent = s.ok();
      return AfterAllRanks(world, "send waited", s);
    }
    absl::Status posted = p2p.PostRecvGrads(0, 1, 2, layout, "1RECV_B0");
    // Returns once the sender's WaitSends has returned (or failed).
    PP_RETURN_IF_ERROR(AfterAllRanks(world, "send waited", posted));
    PP_RETURN_IF_ERROR(Check(sent, "the send completed before the receive was waited for"));
    PP_ASSIGN_OR_RETURN(Activations got, p2p.RecvGrads(0, 1, 2, layout, "1RECV_B0"));
    return Check(torch::equal(got[0].detach(), torch::ones({2, 3})), "value");
  });
  EXPECT_STATUS_OK(s);
}

// A posted receive whose peer stays silent: the wait ends with the timeout,
// naming the action and the peer, and every posted receive (the other
// channel's too) is aborted: nothing stays posted.
TEST(P2PPostAheadTest, PostedReceiveTimesOutNamingPeerAndLeavesNothingPosted) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
    P2POptions options = OptionsFor(Mode::kDynamic, milliseconds(500));
    options.global_ranks = {4, 5};
    P2P p2p(world.group, options);
    if (world.rank == 0) return AfterAllRanks(world, "receiver timed out");
    return AfterAllRanks(world, "receiver timed out", [&]() -> absl::Status {
      PP_RETURN_IF_ERROR(p2p.PostRecvActivations(0, 0, 1, "1RECV_F3"));
      PP_RETURN_IF_ERROR(p2p.PostRecvActivations(0, 0, 1, "1RECV_F4"));
      PP_RETURN_IF_ERROR(p2p.PostRecvGrads(0, 1, 2, {{torch::kFloat, {4}, true}}, "1RECV_B0"));
      auto got = p2p.RecvActivations(0, 0, 1, "1RECV_F3 on rank 1");
      PP_RETURN_IF_ERROR(Check(!got.ok(), "must fail"));
      const std::string msg(got.status().message());
      PP_RETURN_IF_ERROR(Check(got.status().code() == absl::StatusCode::kDeadlineExceeded,
                               "deadline exceeded: " + msg));
      PP_RETURN_IF_ERROR(
          Check(msg.find("1RECV_F3 on rank 1") != std::string::npos, "names action: " + msg));
      PP_RETURN_IF_ERROR(
          Check(msg.find("global rank 4 (stage 0)") != std::string::npos, "names peer: " + msg));
      PP_RETURN_IF_ERROR(Check(p2p.posted_receives() == 0, "nothing left posted"));
      return Check(p2p.stats().posted_receives_aborted == 3,
                   "3 aborted: " + std::to_string(p2p.stats().posted_receives_aborted));
    }());
  });
  EXPECT_STATUS_OK(s);
}

// A wait that does not match what was posted (a gradient layout other than
// the posted one) fails naming both and aborts everything posted; an explicit
// AbortPostedReceives leaves nothing posted either.
TEST(P2PPostAheadTest, MismatchedWaitAndAbortLeaveNothingPosted) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [](World& world) -> absl::Status {
    P2P p2p(world.group, OptionsFor(Mode::kDynamic, milliseconds(20000)));
    if (world.rank == 0) return absl::OkStatus();
    const std::vector<TensorMeta> posted = {{torch::kFloat, {4}, true}};
    const std::vector<TensorMeta> other = {{torch::kFloat, {5}, true}};
    PP_RETURN_IF_ERROR(p2p.PostRecvGrads(0, 1, 2, posted, "1RECV_B0"));
    PP_RETURN_IF_ERROR(p2p.PostRecvActivations(0, 0, 1, "1RECV_F1"));
    auto got = p2p.RecvGrads(0, 1, 2, other, "1RECV_B0");
    PP_RETURN_IF_ERROR(Check(!got.ok(), "must fail"));
    const std::string msg(got.status().message());
    PP_RETURN_IF_ERROR(Check(
        msg.find("Float[4]") != std::string::npos && msg.find("Float[5]") != std::string::npos,
        "names both layouts: " + msg));
    PP_RETURN_IF_ERROR(Check(p2p.posted_receives() == 0, "nothing left posted after the error"));
    PP_RETURN_IF_ERROR(p2p.PostRecvActivations(0, 0, 1, "1RECV_F2"));
    PP_RETURN_IF_ERROR(Check(p2p.posted_receives() == 1, "one posted"));
    p2p.AbortPostedReceives();
    PP_RETURN_IF_ERROR(Check(p2p.posted_receives() == 0, "nothing left posted after abort"));
    return Check(p2p.stats().posted_receives_aborted == 3, "3 aborted in all");
  });
  EXPECT_STATUS_OK(s);
}

// The same exchange on each device: rank r on cuda:r (two GPUs) with NCCL,
// both ranks on cuda:0 with host-staged Gloo (cuda_shared),
// or the CPU with Gloo. Received tensors land on the rank's device; device
// transfers go through the send/receive streams (device_streams.h) and
// dynamic headers and gradients all arrive intact, in the
// order NCCL pairs them (each rank posts in program order).
class P2PDeviceTest : public ::testing::TestWithParam<TestPlacement> {};

TEST_P(P2PDeviceTest, ActivationsAndGradsArriveOnTheRankDevice) {
  const TestPlacement& placement = GetParam();
  absl::StatusOr<c10::Device> first = TestDevice(placement.kind, 2, placement.RanksPerDevice(2));
  if (!first.ok()) GTEST_SKIP() << first.status().message();
  absl::Status s = RunOnThreadRanks(
      2, placement.kind, placement.RanksPerDevice(2), milliseconds(60000),
      [](World& world) -> absl::Status {
        const c10::Device device = world.device;
        P2POptions options{milliseconds(60000)};
        options.device = device;
        P2P p2p(world.group, options);
        const auto on = torch::TensorOptions().device(device);
        for (int round = 0; round < 3; ++round) {
          // Round 1 changes the shape: a new header.
          const int64_t rows = round == 1 ? 3 : 2;
          if (world.rank == 0) {
            torch::Tensor x = (torch::arange(rows * 4, on.dtype(torch::kFloat)) + round)
                                  .reshape({rows, 4})
                                  .requires_grad_(true);
            torch::Tensor ids = torch::arange(rows, on.dtype(torch::kLong));
            PP_RETURN_IF_ERROR(p2p.SendActivations(1, 0, 1, {x, ids}, "0SEND_F", round));
            PP_ASSIGN_OR_RETURN(Activations grads,
                                p2p.RecvGrads(1, 0, 1, LayoutOf({x, ids}), "0RECV_B"));
            PP_RETURN_IF_ERROR(Check(grads.size() == 1 && grads[0].device() == device,
                                     "one gradient on the rank's device"));
            PP_RETURN_IF_ERROR(
                Check(torch::equal(grads[0].cpu(), (x.detach() * 2).cpu()), "gradient values"));
          } else {
            int64_t id = -1;
            PP_ASSIGN_OR_RETURN(Activations got, p2p.RecvActivations(0, 0, 1, "1RECV_F", &id));
            PP_RETURN_IF_ERROR(Check(got.size() == 2 && id == round, "two tensors and the id"));
            PP_RETURN_IF_ERROR(Check(got[0].device() == device && got[1].device() == device,
                                     "received on the rank's device"));
            PP_RETURN_IF_ERROR(Check(
                torch::equal(got[0].detach().cpu(),
                             (torch::arange(rows * 4, torch::kFloat) + round).reshape({rows, 4})),
                "activation values"));
            PP_RETURN_IF_ERROR(
                Check(torch::equal(got[1].cpu(), torch::arange(rows, torch::kLong)), "ids"));
            PP_RETURN_IF_ERROR(p2p.SendGrads(0, 0, 1, {got[0].detach() * 2}, "1SEND_B"));
          }
        }
        PP_RETURN_IF_ERROR(p2p.WaitSends());
        const bool on_device = !device.is_cpu();
        PP_RETURN_IF_ERROR(Check(p2p.streams().active() == on_device, "streams only on a device"));
        if (on_device) {
          PP_RETURN_IF_ERROR(
              Check(p2p.streams().ordered_sends() > 0 && p2p.streams().ordered_receives() > 0,
                    "device transfers went through the streams"));
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Devices, P2PDeviceTest, ::testing::ValuesIn(TestPlacements()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pp
