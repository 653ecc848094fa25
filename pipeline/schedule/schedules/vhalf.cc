#include "pipeline/schedule/schedules/vhalf.h"

#include <algorithm>
#include <array>
#include <deque>
#include <iterator>
#include <map>
#include <tuple>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

// The kinds of a rank's slots. kW is one anonymous W (the squeeze's first
// pass); the final W's are placed per chunk.
enum Kind { kF0 = 0, kF1 = 1, kI1 = 2, kI0 = 3, kW = 4 };

struct Slotted {
  Kind kind;
  int index;  // micro-batch, or for kW the W's position in its rank's order
};

// One rank's slots: by slot (also its occupancy) and by (kind, index).
struct RankSlots {
  std::map<int, Slotted> at;
  std::array<std::vector<int>, 5> slot;

  void Put(Kind kind, int index, int t) {
    slot[kind][index] = t;
    at[t] = {kind, index};
  }
};

// The memory model (units: one virtual stage's activations) walked along a
// rank's slots in order: F adds 1; with explicit W's each W frees 1; without,
// every I leaves a pending W that the next free slot runs.
struct MemoryWalk {
  explicit MemoryWalk(bool explicit_w) : explicit_w(explicit_w) {}

  void Visit(int t, Kind kind) {
    if (!explicit_w) {
      const int ran = std::min(pending, t - previous - 1);
      current -= ran;
      pending -= ran;
    }
    if (kind == kF0 || kind == kF1) ++current;
    if (kind == kI0 || kind == kI1) ++pending;
    if (kind == kW) --current;
    peak = std::max(peak, current);
    previous = t;
  }

  bool explicit_w;
  int current = 0, pending = 0, previous = -1, peak = 0;
};

int PeakMemory(const RankSlots& rank, bool explicit_w) {
  MemoryWalk walk(explicit_w);
  for (const auto& [t, item] : rank.at) walk.Visit(t, item.kind);
  return walk.peak;
}

// Step 2 for one pass: anonymous W's in the free slots, after the last I if
// they do not fit.
void PlaceAnonymousW(RankSlots& rank) {
  std::vector<int> w;
  int pending = 0, previous = -1;
  const std::map<int, Slotted> compute = rank.at;
  for (const auto& [t, item] : compute) {
    for (int free = previous + 1; free < t && pending > 0; ++free, --pending) w.push_back(free);
    if (item.kind == kI0 || item.kind == kI1) ++pending;
    previous = t;
  }
  for (; pending > 0; --pending) w.push_back(++previous);
  rank.slot[kW].assign(w.size(), 0);
  for (int k = 0; k < static_cast<int>(w.size()); ++k) rank.Put(kW, k, w[k]);
}

// Step 3's one pass over every rank. `explicit_w`: the first pass (W's in the
// slots, the warm-up squeezed too); otherwise only the cool-down moves.
void Squeeze(std::vector<RankSlots>& ranks, int m, bool explicit_w) {
  const int p = static_cast<int>(ranks.size());
  const int kinds = explicit_w ? 5 : 4;
  int cap = 0;
  for (const RankSlots& rank : ranks) cap = std::max(cap, PeakMemory(rank, explicit_w));
  // (slot, rank, kind, index), the order the actions are visited in.
  std::vector<std::tuple<int, int, int, int>> order;
  for (int r = 0; r < p; ++r) {
    for (int kind = 0; kind < kinds; ++kind) {
      const std::vector<int>& slots = ranks[r].slot[kind];
      for (int i = 0; i < static_cast<int>(slots.size()); ++i)
        order.emplace_back(slots[i], r, kind, i);
    }
  }
  std::sort(order.begin(), order.end());
  // Per rank, the memory after each slot visited so far (every slot before
  // the action being visited is: the order is by slot, and moves go earlier).
  std::vector<std::map<int, MemoryWalk>> after(p);
  // Per rank, the slots of the I's visited so far, in order: the i-th W
  // follows the i-th (all before it are visited, so these are final).
  std::vector<std::vector<int>> inputs_visited(p);
  auto VisitedInput = [&](int r, int slot) {
    std::vector<int>& inputs = inputs_visited[r];
    inputs.insert(std::upper_bound(inputs.begin(), inputs.end(), slot), slot);
  };
  auto StateBefore = [&](int r, int slot) {
    const auto it = after[r].lower_bound(slot);
    return it == after[r].begin() ? MemoryWalk(explicit_w) : std::prev(it)->second;
  };
  enum { kWarmup, kSteady, kCooldown } phase = kWarmup;
  bool last_forward_seen = false;
  for (const auto& [t, r, kind_index, i] : order) {
    const Kind kind = static_cast<Kind>(kind_index);
    const bool last_forward = kind == kF0 && i == m - 1;
    if (phase == kWarmup && kind == kI0 && r == 0) phase = last_forward_seen ? kCooldown : kSteady;
    last_forward_seen = last_forward_seen || last_forward;
    const bool steady = phase == kSteady;
    if (steady && last_forward) phase = kCooldown;
    RankSlots& rank = ranks[r];
    if (steady || (phase == kWarmup && !explicit_w)) {
      MemoryWalk state = StateBefore(r, t);
      state.Visit(t, kind);
      after[r].insert_or_assign(t, state);
      if (kind == kI0 || kind == kI1) VisitedInput(r, t);
      continue;
    }
    // Ready one slot after the latest dependency: the same pass on the
    // neighbouring rank (chunk 0's forward and chunk 1's backward come from
    // rank r - 1, the others from r + 1), the previous kind of the same
    // micro-batch here, the previous micro-batch of the same kind, and for a
    // W the I it follows.
    int ready = -1;
    if ((kind == kF0 || kind == kI1) && r > 0) ready = std::max(ready, ranks[r - 1].slot[kind][i]);
    if ((kind == kF1 || kind == kI0) && r + 1 < p) {
      ready = std::max(ready, ranks[r + 1].slot[kind][i]);
    }
    if (kind != kF0 && kind != kW) ready = std::max(ready, rank.slot[kind - 1][i]);
    if (kind == kW) {
      CHECK_LT(i, static_cast<int>(inputs_visited[r].size())) << "vhalf: a W before its I";
      ready = std::max(ready, inputs_visited[r][i]);
    }
    if (i > 0) ready = std::max(ready, rank.slot[kind][i - 1]);
    ++ready;
    CHECK_LE(ready, t) << "vhalf: a dependency after its action";
    // Every rank is within the cap before the move, and a move changes its
    // memory only from `ready` on (with explicit W's, only up to t): so the
    // check walks from there, from the state the slots before it leave.
    const MemoryWalk before = StateBefore(r, ready);
    auto fits = [&] {
      MemoryWalk walk = before;
      for (auto it = rank.at.lower_bound(ready);
           it != rank.at.end() && (!explicit_w || it->first <= t); ++it) {
        walk.Visit(it->first, it->second.kind);
        if (walk.current > cap) return false;
      }
      return true;
    };
    int placed = t;
    for (int candidate = ready; candidate < t; ++candidate) {
      if (rank.at.count(candidate)) continue;
      rank.at.erase(t);
      rank.Put(kind, i, candidate);
      if (fits()) {
        placed = candidate;
        break;
      }
      rank.at.erase(candidate);
      rank.Put(kind, i, t);
    }
    if (kind == kI0 || kind == kI1) VisitedInput(r, placed);
    // The states after `placed` (all visited by now, up to t) again.
    std::map<int, MemoryWalk>& states = after[r];
    states.erase(states.lower_bound(placed), states.end());
    MemoryWalk walk = StateBefore(r, placed);
    for (auto it = rank.at.lower_bound(placed); it != rank.at.end() && it->first <= t; ++it) {
      walk.Visit(it->first, it->second.kind);
      states.insert_or_assign(it->first, walk);
    }
  }
}

}  // namespace

absl::StatusOr<Schedule> MakeVHalf(const ScheduleOptions& options, const VHalfLayout& layout,
                                   std::vector<std::vector<double>>* slots) {
  CHECK(layout.extra_gap >= 0 && layout.extra_gap % 6 == 0)
      << "vhalf: extra_gap " << layout.extra_gap << " is not a multiple of the period, 6";
  if (options.num_chunks != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("vhalf places exactly two chunks per rank (a V): num_chunks (",
                     options.num_chunks, ") must be 2"));
  }
  const int p = options.num_stages, m = options.num_microbatches;
  Schedule schedule = EmptyLoopedSchedule("vhalf", options);
  schedule.stage_to_rank = VPlacement(p);
  const int g = (p % 2 == 0 ? 3 : 0) + layout.extra_gap;
  std::vector<RankSlots> ranks(p);
  for (int r = 0; r < p; ++r) {
    const std::array<int, 4> offset = {2 * r, 3 * p - r - 2, 3 * p + g + 2 * r - 1,
                                       6 * p + g - r - 2};
    for (int kind = 0; kind < 4; ++kind) {
      ranks[r].slot[kind].assign(m, 0);
      for (int k = 0; k < m; ++k) ranks[r].Put(static_cast<Kind>(kind), k, offset[kind] + 6 * k);
    }
  }
  if (layout.squeeze) {
    for (RankSlots& rank : ranks) PlaceAnonymousW(rank);
    Squeeze(ranks, m, /*explicit_w=*/true);
    for (RankSlots& rank : ranks) {
      for (int t : rank.slot[kW]) rank.at.erase(t);
      rank.slot[kW].clear();
    }
    Squeeze(ranks, m, /*explicit_w=*/false);
  }
  if (slots != nullptr) slots->assign(p, {});
  for (int r = 0; r < p; ++r) {
    const int s0 = r, s1 = 2 * p - 1 - r;
    std::vector<Action>& actions = schedule.ranks[r];
    std::deque<int> pending0, pending1;
    auto run_one_w = [&](int slot) {
      std::deque<int>& from = pending1.empty() ? pending0 : pending1;
      actions.push_back(W(&from == &pending1 ? s1 : s0, from.front()));
      from.pop_front();
      if (slots != nullptr) (*slots)[r].push_back(slot);
    };
    int previous = -1;
    for (const auto& [t, item] : ranks[r].at) {
      for (int free = previous + 1; free < t && !(pending0.empty() && pending1.empty()); ++free) {
        run_one_w(free);
      }
      if (slots != nullptr) (*slots)[r].push_back(t);
      switch (item.kind) {
        case kF0:
          actions.push_back(F(s0, item.index));
          break;
        case kF1:
          actions.push_back(F(s1, item.index));
          break;
        case kI1:
          actions.push_back(I(s1, item.index));
          pending1.push_back(item.index);
          break;
        case kI0:
          actions.push_back(I(s0, item.index));
          pending0.push_back(item.index);
          break;
        case kW:
          LOG(FATAL) << "vhalf: a W left in the slots";
      }
      previous = t;
    }
    while (!(pending0.empty() && pending1.empty())) run_one_w(++previous);
  }
  return schedule;
}

PP_REGISTER_SCHEDULE("vhalf",
                     "V-Half (controllable-memory V): 2 chunks per rank in V placement, I/W split, "
                     "p + 2 activations per rank where zbv holds 2p",
                     [](const ScheduleOptions& options) { return MakeVHalf(options); });

}  // namespace pp
