#include "pipeline/schedule/ir/internal_execution.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pp {
namespace internal_schedule {
namespace {

absl::Status ProgramError(const LoweredProgram& program, int rank, int pos,
                          absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(
      "lowered program of \"", program.schedule_name, "\" (p=", program.num_stages,
      ", m=", program.num_microbatches, ", v=", program.num_chunks, "): rank ", rank, " step ", pos,
      ": ", message, "\n", FormatGrid(program.ranks, GridMark{rank, pos})));
}

// The RECV that matches a SEND (and vice versa), seen from the peer.
Action Counterpart(const Action& a) {
  const int peer = PeerStage(a);
  switch (a.type) {
    case ActionType::kSendForward:
      return {peer, ActionType::kRecvForward, a.microbatch};
    case ActionType::kRecvForward:
      return {peer, ActionType::kSendForward, a.microbatch};
    case ActionType::kSendBackward:
      return {peer, ActionType::kRecvBackward, a.microbatch};
    default:
      return {peer, ActionType::kSendBackward, a.microbatch};
  }
}

// Static checks of the program: its ranks, placement, and every action's
// stage, micro-batch and peer.
absl::Status CheckProgram(const LoweredProgram& program) {
  const int p = program.num_stages;
  const int num_virtual = static_cast<int>(program.stage_to_rank.size());
  const int m = program.num_microbatches;
  if (static_cast<int>(program.ranks.size()) != p) {
    return absl::InvalidArgumentError(
        absl::StrCat("lowered program has ", program.ranks.size(), " ranks for num_stages ", p));
  }
  for (int s = 0; s < num_virtual; ++s) {
    if (program.stage_to_rank[s] < 0 || program.stage_to_rank[s] >= p) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", s, " is placed on rank ", program.stage_to_rank[s], ", outside [0, ", p, ")"));
    }
  }
  if (program.vocab_parallel && program.vocab_barriers != 1 && program.vocab_barriers != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("program \"", program.schedule_name, "\": vocab_barriers is ",
                     program.vocab_barriers, "; the output layer's algorithm has 1 or 2 barriers"));
  }
  // Static checks of every action.
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < static_cast<int>(program.ranks[r].size()); ++i) {
      const Action& a = program.ranks[r][i];
      if (IsVocab(a.type) && !program.vocab_parallel) {
        return ProgramError(program, r, i,
                            "a vocabulary action in a program without vocabulary parallelism");
      }
      if (program.forward_only &&
          (a.type == ActionType::kVocabOutputT || a.type == ActionType::kVocabInputB ||
           a.type == ActionType::kVocabOutputReduce ||
           a.type == ActionType::kVocabInputBroadcast)) {
        return ProgramError(program, r, i,
                            "a backward vocabulary action in a forward-only program");
      }
      if (a.type == ActionType::kOverlapFB) {
        absl::Status pair = CheckOverlapPair(ForwardHalf(a), BackwardHalf(a));
        if (!pair.ok()) return ProgramError(program, r, i, pair.message());
      }
      for (const Action& leaf : Leaves(a)) {
        if (HasStage(leaf.type)) {
          if (leaf.stage < 0 || leaf.stage >= num_virtual) {
            return ProgramError(
                program, r, i,
                absl::StrCat("stage ", leaf.stage, " is outside [0, ", num_virtual, ")"));
          }
          if (program.stage_to_rank[leaf.stage] != r) {
            return ProgramError(program, r, i,
                                absl::StrCat("stage ", leaf.stage, " is placed on rank ",
                                             program.stage_to_rank[leaf.stage]));
          }
        }
        if (HasMicrobatch(leaf.type) && (leaf.microbatch < 0 || leaf.microbatch >= m)) {
          return ProgramError(
              program, r, i,
              absl::StrCat("micro-batch ", leaf.microbatch, " is outside [0, ", m, ")"));
        }
      }
      if (IsCommunication(a.type)) {
        const int peer = PeerStage(a);
        if (peer < 0 || peer >= num_virtual) {
          return ProgramError(program, r, i, absl::StrCat("peer stage ", peer, " does not exist"));
        }
        if (program.stage_to_rank[peer] == r) {
          return ProgramError(program, r, i,
                              absl::StrCat("peer stage ", peer,
                                           " is on the same rank: stages on one "
                                           "rank hand over locally, without a message"));
        }
      }
    }
  }
  return absl::OkStatus();
}

// The ranks of collective `a` of `rank`: every rank for the vocabulary's,
// costs.participants' for the tail (null or empty: the rank alone).
std::vector<int> Participants(const LoweredProgram& program, const ExecutionCosts& costs, int rank,
                              const Action& a) {
  std::vector<int> group;
  if (IsVocabCollective(a.type)) {
    for (int q = 0; q < program.num_stages; ++q) group.push_back(q);
  } else if (costs.participants) {
    group = costs.participants(rank, a);
  }
  if (group.empty()) group = {rank};
  return group;
}

// Where each unfinished rank of a stuck execution waits (`pos`: each rank's
// next action), and for whom.
absl::Status DeadlockError(const LoweredProgram& program, const ExecutionCosts& costs,
                           const std::vector<int>& pos,
                           const std::function<std::string(int)>& async_wait) {
  const int p = program.num_stages;
  std::string waits;
  int first = -1;
  for (int r = 0; r < p; ++r) {
    if (pos[r] == static_cast<int>(program.ranks[r].size())) continue;
    if (first < 0) first = r;
    const Action& a = program.ranks[r][pos[r]];
    if (std::string awaited = async_wait(r); !awaited.empty()) {
      absl::StrAppend(&waits, "\n  rank ", r, " step ", pos[r], ": ", ActionToString(a),
                      " waits for ", awaited);
      continue;
    }
    if (IsCollective(a.type)) {
      absl::StrAppend(&waits, "\n  rank ", r, " step ", pos[r], ": ", ActionToString(a),
                      " waits for the other participants of the collective:");
      for (int q : Participants(program, costs, r, a)) {
        if (q == r) continue;
        absl::StrAppend(&waits, " rank ", q, " ");
        if (pos[q] == static_cast<int>(program.ranks[q].size())) {
          absl::StrAppend(&waits, "has finished its program;");
        } else {
          absl::StrAppend(&waits, "is at step ", pos[q], ": ",
                          ActionToString(program.ranks[q][pos[q]]), ";");
        }
      }
      continue;
    }
    const int q = program.stage_to_rank[PeerStage(a)];
    absl::StrAppend(&waits, "\n  rank ", r, " step ", pos[r], ": ", ActionToString(a),
                    " waits for rank ", q, " (", ActionToString(Counterpart(a)), "), which ");
    if (pos[q] == static_cast<int>(program.ranks[q].size())) {
      absl::StrAppend(&waits, "has finished its program");
    } else {
      absl::StrAppend(&waits, "is at step ", pos[q], ": ",
                      ActionToString(program.ranks[q][pos[q]]));
    }
  }
  // Called only when some rank has not finished: first >= 0.
  return ProgramError(program, first, pos[first],
                      absl::StrCat("deadlock (blocking send/recv or a collective):", waits));
}

}  // namespace

absl::StatusOr<Execution> Execute(const LoweredProgram& program, const ExecutionCosts& costs) {
  if (absl::Status checked = CheckProgram(program); !checked.ok()) return checked;
  const int p = program.num_stages;
  const int num_virtual = static_cast<int>(program.stage_to_rank.size());
  const int m = program.num_microbatches;
  Execution ex;
  ex.start.resize(p);
  ex.end.resize(p);
  for (int r = 0; r < p; ++r) {
    ex.start[r].assign(program.ranks[r].size(), -1);
    ex.end[r].assign(program.ranks[r].size(), -1);
  }
  // Dense state over (type, stage, mb) for compute and communication types
  // (ranges were checked above; a stage runs on one rank only, so one table
  // serves all ranks). Hash sets here made the conformance suite 3x slower.
  constexpr int kDenseTypes = 8;  // F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B
  auto key = [&](const Action& a) {
    return (static_cast<int>(a.type) * num_virtual + a.stage) * m + a.microbatch;
  };
  std::vector<char> done_table(kDenseTypes * num_virtual * m, 0);
  std::vector<double> sent(kDenseTypes * num_virtual * m, -1);  // arrival time
  // Vocabulary actions, per rank: [type - OUT_S][rank][mb].
  auto vocab_key = [&](int rank, const Action& a) {
    return (VocabTypeIndex(a.type) * p + rank) * m + a.microbatch;
  };
  std::vector<char> vocab_done(program.vocab_parallel ? kNumVocabTypes * p * m : 0, 0);
  auto vocab_has = [&](int rank, ActionType type, int mb) {
    return vocab_done[vocab_key(rank, Vocab(type, mb))] != 0;
  };
  auto mark_done = [&](int rank, const Action& a) {
    if (IsVocab(a.type)) {
      vocab_done[vocab_key(rank, a)] = 1;
    } else if (HasMicrobatch(a.type)) {
      done_table[key(a)] = 1;
    }
  };
  std::vector<int> pos(p, 0);
  std::vector<double> clock(p, 0);
  auto has = [&](int /*rank*/, const Action& a) {
    return a.stage >= 0 && a.stage < num_virtual && done_table[key(a)] != 0;
  };
  // Whether the input an action needs is on rank r; empty string if so.
  const bool vocab = program.vocab_parallel;
  const int last = num_virtual - 1;
  auto vocab_missing = [&](int r, ActionType type, int mb) -> std::string {
    return vocab_has(r, type, mb)
               ? ""
               : absl::StrCat("its input (", ActionToString(Vocab(type, mb)), ") is not there");
  };
  auto missing_input = [&](int r, const Action& a) -> std::string {
    const int s = a.stage, mb = a.microbatch;
    switch (a.type) {
      case ActionType::kForward:
        if (s == 0 && vocab) return vocab_missing(r, ActionType::kVocabInputReduce, mb);
        if (s == 0 || has(r, {s, ActionType::kRecvForward, mb}) ||
            (program.stage_to_rank[s - 1] == r && has(r, F(s - 1, mb)))) {
          return "";
        }
        return absl::StrCat("its input (", s - 1, "F", mb, " or ", s, "RECV_F", mb,
                            ") is not there");
      case ActionType::kBackward:
      case ActionType::kBackwardInput:
        if (!has(r, F(s, mb))) return absl::StrCat("its forward ", s, "F", mb, " has not run");
        if (s == last && vocab) return vocab_missing(r, ActionType::kVocabOutputReduce, mb);
        if (s == num_virtual - 1 || has(r, {s, ActionType::kRecvBackward, mb}) ||
            (program.stage_to_rank[s + 1] == r && (has(r, B(s + 1, mb)) || has(r, I(s + 1, mb))))) {
          return "";
        }
        return absl::StrCat("its output gradient (", s, "RECV_B", mb,
                            " or a local backward of stage ", s + 1, ") is not there");
      case ActionType::kBackwardWeight:
        return has(r, I(s, mb)) ? "" : absl::StrCat(s, "I", mb, " has not run");
      case ActionType::kSendForward:
        return has(r, F(s, mb)) ? "" : absl::StrCat("it sends ", s, "F", mb, ", which has not run");
      case ActionType::kSendBackward:
        return has(r, B(s, mb)) || has(r, I(s, mb))
                   ? ""
                   : absl::StrCat("it sends the input gradient of ", s, "B", mb, " (or ", s, "I",
                                  mb, "), which has not run");
      case ActionType::kVocabOutputS:
        return vocab_missing(r, ActionType::kVocabOutputBroadcast, mb);
      case ActionType::kVocabOutputT:
        return vocab_missing(r, ActionType::kVocabOutputStats, mb);
      case ActionType::kVocabInputB:
        return vocab_missing(r, ActionType::kVocabInputBroadcast, mb);
      case ActionType::kVocabOutputStats:
        return vocab_has(r, ActionType::kVocabOutputS, mb)
                   ? ""
                   : absl::StrCat("it gathers the statistics of OUT_S", mb, ", which has not run");
      case ActionType::kVocabOutputReduce:
        // One barrier: it rescales OUT_S's partial with OUT_STATS's result.
        if (program.vocab_barriers == 1) {
          return vocab_has(r, ActionType::kVocabOutputStats, mb)
                     ? ""
                     : absl::StrCat("it rescales OUT_S", mb, "'s partial with OUT_STATS", mb,
                                    ", which has not run");
        }
        return vocab_has(r, ActionType::kVocabOutputT, mb)
                   ? ""
                   : absl::StrCat("it sums the gradients of OUT_T", mb, ", which has not run");
      case ActionType::kVocabInputReduce:
        return vocab_has(r, ActionType::kVocabInputF, mb)
                   ? ""
                   : absl::StrCat("it sums the embeddings of IN_F", mb, ", which has not run");
      case ActionType::kVocabOutputBroadcast:
        if (program.stage_to_rank[last] != r || has(r, F(last, mb))) return "";
        return absl::StrCat("it broadcasts the output of ", last, "F", mb, ", which has not run");
      case ActionType::kVocabInputBroadcast:
        if (program.stage_to_rank[0] != r || has(r, B(0, mb)) || has(r, I(0, mb))) return "";
        return absl::StrCat("it broadcasts the input gradient of 0B", mb, " (or 0I", mb,
                            "), which has not run");
      default:
        return "";
    }
  };

  // Asynchronous vocabulary collectives (ExecutionCosts::
  // async_vocab_collectives): per (type, micro-batch), how many ranks posted
  // it, the latest post, and its completion once every rank has (-1 before).
  const bool async_vocab = vocab && costs.async_vocab_collectives;
  auto collective_key = [&](ActionType type, int mb) { return VocabTypeIndex(type) * m + mb; };
  std::vector<int> posts(async_vocab ? kNumVocabTypes * m : 0, 0);
  std::vector<double> latest_post(posts.size(), 0), completion(posts.size(), -1);
  // Where each was posted, (rank, position), for Execution::completed.
  std::vector<std::vector<std::pair<int, int>>> posted_at(posts.size());
  if (async_vocab) {
    ex.completed.resize(p);
    for (int r = 0; r < p; ++r) ex.completed[r].assign(program.ranks[r].size(), -1);
  }
  // The order of the posts: the transport matches collectives by their order
  // on each rank (Gloo's tags), so every rank must post them in one order.
  std::vector<Action> post_order;
  std::vector<int> posted_by_rank(p, 0);
  // The collectives rank r waits for before `a`: the one each leaf reads, or
  // for a tail action every one the rank posted.
  auto awaited_by = [&](int r, const Action& a) {
    std::vector<Action> out;
    if (IsTail(a.type)) {
      for (int type = 0; type < kNumVocabTypes; ++type) {
        const auto t = static_cast<ActionType>(static_cast<int>(ActionType::kVocabOutputS) + type);
        if (!IsVocabCollective(t)) continue;
        for (int mb = 0; mb < m; ++mb) {
          if (vocab_has(r, t, mb)) out.push_back(Vocab(t, mb));
        }
      }
      return out;
    }
    for (const Action& leaf : Leaves(a)) {
      if (std::optional<Action> c =
              VocabCollectiveReadBy(leaf, num_virtual, program.vocab_barriers)) {
        out.push_back(*c);
      }
    }
    return out;
  };
  // When rank r may start `a` as far as asynchronous collectives go: the
  // latest completion it waits for (0 if none), or -1 while one has not
  // completed (a rank has not posted it).
  auto async_ready = [&](int r, const Action& a) {
    double ready = 0;
    if (!async_vocab) return ready;
    for (const Action& c : awaited_by(r, a)) {
      const double done = completion[collective_key(c.type, c.microbatch)];
      if (done < 0) return -1.0;
      ready = std::max(ready, done);
    }
    return ready;
  };
  // For a deadlock report: what rank r waits for if an asynchronous
  // collective holds it ("" otherwise).
  auto async_wait = [&](int r) -> std::string {
    if (!async_vocab || pos[r] >= static_cast<int>(program.ranks[r].size())) return "";
    for (const Action& c : awaited_by(r, program.ranks[r][pos[r]])) {
      if (completion[collective_key(c.type, c.microbatch)] >= 0) continue;
      std::string out = absl::StrCat(ActionToString(c), ", which has not been posted by");
      for (int q = 0; q < p; ++q) {
        if (!vocab_has(q, c.type, c.microbatch)) absl::StrAppend(&out, " rank ", q);
      }
      return out;
    }
    return "";
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (pos[r] < static_cast<int>(program.ranks[r].size())) {
        const int i = pos[r];
        const Action& a = program.ranks[r][i];
        // An OVERLAP_F_B's halves run back to back: the second's input
        // cannot come from the first (different micro-batches).
        for (const Action& leaf : Leaves(a)) {
          std::string missing = missing_input(r, leaf);
          if (!missing.empty()) {
            return ProgramError(program, r, i,
                                absl::StrCat(ActionToString(leaf), " cannot run: ", missing));
          }
        }
        const double ready = async_ready(r, a);
        if (ready < 0) break;  // waits for an asynchronous collective
        if (async_vocab && IsVocabCollective(a.type)) {
          if (vocab_has(r, a.type, a.microbatch)) {
            return ProgramError(program, r, i,
                                absl::StrCat(ActionToString(a), " is posted twice on rank ", r));
          }
          const int nth = posted_by_rank[r]++;
          if (nth == static_cast<int>(post_order.size())) post_order.push_back(a);
          if (post_order[nth] != a) {
            return ProgramError(
                program, r, i,
                absl::StrCat(ActionToString(a), " is rank ", r, "'s vocabulary collective number ",
                             nth + 1, ", where another rank's is ", ActionToString(post_order[nth]),
                             ": asynchronous collectives are matched by their order, so every "
                             "rank must post them in one order"));
          }
          // Posted: the rank goes on; the collective runs once all have it.
          const double t = std::max(clock[r], ready);
          ex.start[r][i] = ex.end[r][i] = clock[r] = t;
          const int k = collective_key(a.type, a.microbatch);
          latest_post[k] = std::max(latest_post[k], t);
          posted_at[k].push_back({r, i});
          if (++posts[k] == p) {
            completion[k] =
                latest_post[k] + (costs.vocab_collective ? costs.vocab_collective(r, a) : 0.0);
            for (const auto& [q, j] : posted_at[k]) ex.completed[q][j] = completion[k];
          }
          mark_done(r, a);
          ++pos[r];
          progress = true;
          continue;
        }
        if (IsCollective(a.type)) {
          const std::vector<int> group = Participants(program, costs, r, a);
          if (std::find(group.begin(), group.end(), r) == group.end()) {
            return ProgramError(
                program, r, i,
                absl::StrCat("the participants of ", ActionToString(a), " leave out its own rank"));
          }
          bool gathered = true;
          for (int q : group) {
            if (q < 0 || q >= p) {
              return ProgramError(program, r, i,
                                  absl::StrCat(ActionToString(a), " has participant rank ", q,
                                               " outside [0, ", p, ")"));
            }
            const bool there = pos[q] < static_cast<int>(program.ranks[q].size()) &&
                               program.ranks[q][pos[q]].type == a.type &&
                               program.ranks[q][pos[q]].stage == a.stage &&
                               program.ranks[q][pos[q]].microbatch == a.microbatch;
            if (!there || async_ready(q, program.ranks[q][pos[q]]) < 0) {
              gathered = false;
              break;
            }
          }
          if (!gathered) break;  // waits in the collective
          for (int q : group) {
            std::string missing = missing_input(q, program.ranks[q][pos[q]]);
            if (!missing.empty()) {
              return ProgramError(program, q, pos[q],
                                  absl::StrCat(ActionToString(a), " cannot run: ", missing));
            }
          }
          double t = 0;
          for (int q : group) {
            t = std::max({t, clock[q], async_ready(q, program.ranks[q][pos[q]])});
          }
          for (int q : group) {
            const int j = pos[q];
            const Action& own = program.ranks[q][j];
            ex.start[q][j] = t;  // waiting before t is idle
            if (IsVocabCollective(own.type)) {
              clock[q] = t + (costs.vocab_collective ? costs.vocab_collective(q, own) : 0.0);
            } else {
              clock[q] = t + (costs.tail ? costs.tail(q, own) : 0.0);
            }
            ex.end[q][j] = clock[q];
            mark_done(q, own);
            ++pos[q];
          }
          progress = true;
          continue;
        }
        if (!IsCommunication(a.type)) {
          clock[r] = std::max(clock[r], ready);
          ex.start[r][i] = clock[r];
          for (const Action& leaf : Leaves(a)) {
            clock[r] +=
                IsCompute(leaf.type) || IsVocabCompute(leaf.type) ? costs.compute(leaf) : 0.0;
            mark_done(r, leaf);
          }
          ex.end[r][i] = clock[r];
          ++pos[r];
          progress = true;
          continue;
        }
        if (!costs.blocking_sends) {
          if (a.type == ActionType::kSendForward || a.type == ActionType::kSendBackward) {
            ex.start[r][i] = clock[r];
            clock[r] += costs.send ? costs.send(r, a) : 0.0;
            ex.end[r][i] = clock[r];
            sent[key(a)] = clock[r] + costs.message_latency;
          } else {
            const double arrival = sent[key(Counterpart(a))];
            if (arrival < 0) break;  // not sent yet
            // The recorded span is the transfer seen by this rank, not the
            // wait for it (that is idle time).
            ex.start[r][i] = std::max(clock[r], arrival - costs.message_latency);
            clock[r] = std::max(clock[r], arrival) + (costs.recv ? costs.recv(r, a) : 0.0);
            ex.end[r][i] = clock[r];
          }
          mark_done(r, a);
          ++pos[r];
          progress = true;
          continue;
        }
        const int q = program.stage_to_rank[PeerStage(a)];
        if (pos[q] >= static_cast<int>(program.ranks[q].size())) break;
        const int j = pos[q];
        const Action& b = program.ranks[q][j];
        if (b != Counterpart(a)) break;  // peer busy elsewhere (or mismatched)
        std::string peer_missing = missing_input(q, b);
        if (!peer_missing.empty()) {
          return ProgramError(program, q, j,
                              absl::StrCat(ActionToString(b), " cannot run: ", peer_missing));
        }
        const double t = std::max(clock[r], clock[q]);
        const bool r_sends =
            a.type == ActionType::kSendForward || a.type == ActionType::kSendBackward;
        const double send_time = costs.send ? (r_sends ? costs.send(r, a) : costs.send(q, b)) : 0.0;
        const double recv_time = costs.recv ? (r_sends ? costs.recv(q, b) : costs.recv(r, a)) : 0.0;
        ex.start[r][i] = ex.start[q][j] = t;  // waiting before t is idle
        clock[r] = clock[q] = t + send_time + costs.message_latency + recv_time;
        ex.end[r][i] = ex.end[q][j] = clock[r];
        mark_done(r, a);
        mark_done(q, b);
        ++pos[r];
        ++pos[q];
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    if (pos[r] != static_cast<int>(program.ranks[r].size())) {
      return DeadlockError(program, costs, pos, async_wait);
    }
  }
  return ex;
}

}  // namespace internal_schedule
}  // namespace pp
