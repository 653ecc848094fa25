#include "pipeline/schedule/schedules/synthesis.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "pipeline/schedule/analysis/validator.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

constexpr double kEps = 1e-9;

// Per virtual stage costs, resolved the way the simulator resolves them (its
// own cost as is, else the global one times the stage multiplier).
struct StageCost {
  double forward = 0, backward = 0, input = 0, weight = 0;
};

std::vector<StageCost> ResolveStageCosts(const SimulationCosts& costs, int num_virtual) {
  std::vector<StageCost> out(num_virtual);
  for (int s = 0; s < num_virtual; ++s) {
    const double mult = costs.stage_multiplier.empty() ? 1.0 : costs.stage_multiplier[s];
    StageCost& c = out[s];
    c.forward = costs.forward * mult;
    c.backward = costs.backward * mult;
    c.input = costs.backward_input * mult;
    c.weight = costs.backward_weight * mult;
    auto it = costs.stage_costs.find(s);
    if (it == costs.stage_costs.end()) continue;
    const StageCosts& own = it->second;
    if (own.forward) c.forward = *own.forward;
    if (own.backward_input) c.input = *own.backward_input;
    if (own.backward_weight) c.weight = *own.backward_weight;
    if (own.backward) {
      c.backward = *own.backward;
    } else if (own.backward_input && own.backward_weight) {
      c.backward = *own.backward_input + *own.backward_weight;
    }
  }
  return out;
}

std::vector<int> PlacementOf(const SynthesisOptions& o) {
  return o.placement == SynthesisPlacement::kV ? VPlacement(o.num_stages)
                                               : LoopedPlacement(o.num_stages, o.num_chunks);
}

absl::Status CheckShape(const SynthesisOptions& o) {
  ScheduleOptions common;
  common.num_stages = o.num_stages;
  common.num_microbatches = o.num_microbatches;
  common.num_chunks = o.num_chunks;
  PP_RETURN_IF_ERROR(CheckCommonOptions(common));
  if (o.placement == SynthesisPlacement::kV && o.num_chunks != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "V placement holds two chunks per rank: num_chunks (", o.num_chunks, ") must be 2"));
  }
  if (o.max_evaluations < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_evaluations (", o.max_evaluations, ") must be 0 or more"));
  }
  const int num_virtual = o.num_stages * o.num_chunks;
  if (!o.costs.stage_multiplier.empty() &&
      static_cast<int>(o.costs.stage_multiplier.size()) != num_virtual) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage_multiplier has ", o.costs.stage_multiplier.size(),
                     " entries; p * v = ", num_virtual, " virtual stages"));
  }
  if (!o.costs.microbatch_multiplier.empty()) {
    if (static_cast<int>(o.costs.microbatch_multiplier.size()) != o.num_microbatches) {
      return absl::InvalidArgumentError(
          absl::StrCat("microbatch_multiplier has ", o.costs.microbatch_multiplier.size(),
                       " entries; m = ", o.num_microbatches, " micro-batches"));
    }
    for (double x : o.costs.microbatch_multiplier) {
      if (!(x >= 0) || !std::isfinite(x)) {
        return absl::InvalidArgumentError(absl::StrCat("a micro-batch multiplier is ", x,
                                                       "; multipliers must be finite and >= 0"));
      }
    }
  }
  for (const auto& [stage, unused] : o.costs.stage_costs) {
    if (stage < 0 || stage >= num_virtual) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage_costs names virtual stage ", stage, "; valid: 0..", num_virtual - 1));
    }
  }
  for (const StageCost& c : ResolveStageCosts(o.costs, num_virtual)) {
    for (double x : {c.forward, c.backward, c.input, c.weight}) {
      if (!std::isfinite(x) || x < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("compute cost ", x, " must be finite and at least 0"));
      }
    }
  }
  if (!std::isfinite(o.costs.comm) || o.costs.comm < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm (", o.costs.comm, ") must be finite and at least 0"));
  }
  return absl::OkStatus();
}

double DefaultCap(const SynthesisOptions& o) {
  return static_cast<double>(std::min(o.num_stages, o.num_microbatches)) * o.num_chunks;
}

// ---------------------------------------------------------------------------
// List scheduling.

struct Variant {
  bool backward_first = true;  // at equal start: I/B before F (else F first)
  bool hold_w = true;          // a W that would delay a known arrival waits
  double inflight_factor = 0;  // micro-batches in flight on rank r <= ceil(f * (p - r)); 0 = none
  bool depth_first = true;     // among forwards: the deeper stage of a micro-batch first
  // A W goes first once more than delay(r) I's wait for theirs (the
  // zero-bubble schedules' rule: H1 r, H2 2r); 0 = no such rule.
  int w_delay_factor = 0;
};

std::string VariantName(const Variant& v) {
  return absl::StrCat(
      "list(", v.backward_first ? "B" : "F", "-first,", v.hold_w ? "hold-W" : "fill-W",
      ",inflight=", v.inflight_factor == 0 ? std::string("mem") : absl::StrCat(v.inflight_factor),
      v.depth_first ? ",depth" : ",breadth",
      v.w_delay_factor > 0 ? absl::StrCat(",W-delay=", v.w_delay_factor, "r") : "", ")");
}

struct Shape {
  int p, m, v, num_virtual;
  std::vector<int> placement;
  std::vector<std::vector<int>> local;  // rank -> local stages
  std::vector<StageCost> cost;
  std::vector<double> mb_mult;  // per micro-batch multiplier of compute (all 1 by default)
  double comm;
  bool split;
  double input_fraction;
  double cap;
};

Shape MakeShape(const SynthesisOptions& o, double cap) {
  Shape s;
  s.p = o.num_stages;
  s.m = o.num_microbatches;
  s.v = o.num_chunks;
  s.num_virtual = s.p * s.v;
  s.placement = PlacementOf(o);
  s.local.resize(s.p);
  for (int stage = 0; stage < s.num_virtual; ++stage) s.local[s.placement[stage]].push_back(stage);
  s.cost = ResolveStageCosts(o.costs, s.num_virtual);
  s.mb_mult = o.costs.microbatch_multiplier;
  if (s.mb_mult.empty()) s.mb_mult.assign(static_cast<size_t>(s.m), 1.0);
  s.comm = o.costs.comm;
  s.split = o.split_backward;
  s.input_fraction = o.costs.memory.InputFraction();
  s.cap = cap;
  return s;
}

// The greedy list scheduler: at each step, every rank offers the actions it
// could run next; the earliest start wins (ties by the variant's class and
// order); running it updates the times and the memory accounting.
class ListScheduler {
 public:
  ListScheduler(const Shape& sh, const Variant& var)
      : sh_(sh),
        var_(var),
        f_end_(sh.num_virtual, std::vector<double>(sh.m, kUnknown)),
        b_end_(sh.num_virtual, std::vector<double>(sh.m, kUnknown)),
        next_f_(sh.num_virtual, 0),
        next_b_(sh.num_virtual, 0),
        next_w_(sh.num_virtual, 0),
        free_at_(sh.p, 0),
        mem_(sh.p, 0),
        owed_(sh.p, 0),
        f_done_(sh.p, std::vector<int>(sh.m, 0)),
        b_done_(sh.p, std::vector<int>(sh.m, 0)),
        inflight_(sh.p, 0),
        pending_w_(sh.p, 0),
        limit_(sh.p, std::numeric_limits<int>::max()),
        ranks_(sh.p),
        offers_(sh.p),
        earliest_(sh.p, std::numeric_limits<double>::infinity()) {
    if (var.inflight_factor > 0) {
      for (int r = 0; r < sh.p; ++r)
        limit_[r] = std::max(1, int(std::ceil(var.inflight_factor * (sh.p - r))));
    }
    for (int r = 0; r < sh.p; ++r) dirty_.push_back(r);
  }

  // nullopt when the greedy gets stuck (the cap leaves no admissible action).
  std::optional<RankActions> Run() {
    const int total = sh_.p * sh_.v * sh_.m * (sh_.split ? 3 : 2);
    for (int done = 0; done < total; ++done) {
      for (int r : dirty_) RefreshOffers(r);
      dirty_.clear();
      // The ranks' offers in rank order, as one fold: the same choice as
      // offering every rank's candidates afresh. A rank whose earliest offer
      // starts too late to win skips (no offer of it passes `start <
      // best.start + kEps`), which keeps a step at about O(p) comparisons.
      Choice best;
      for (int r = 0; r < sh_.p; ++r) {
        if (earliest_[r] >= best.start + kEps) continue;
        for (const Offer& o : offers_[r]) Consider(o, r, best);
      }
      if (best.rank < 0) return std::nullopt;
      Execute(best);
    }
    return std::move(ranks_);
  }

 private:
  static constexpr double kUnknown = -1;
  enum Kind { kF = 0, kIB = 1, kW = 2 };

  struct Candidate {
    double ready;
    int kind, stage, mb;
    bool allowed;  // within the memory cap and the in-flight limit
  };

  // The best action so far: (start, class, tie, rank) decides.
  struct Choice {
    double start = std::numeric_limits<double>::infinity();
    int cls = 0, tie = 0, rank = -1, stage = -1, kind = -1;
  };

  // An action a rank offers, with its start and its rank-free tie-breaks.
  struct Offer {
    double start;
    int cls, tie, stage, kind;
  };

  double Arrival(int from_stage, int to_stage, double end) const {
    return end + (sh_.placement[from_stage] != sh_.placement[to_stage] ? sh_.comm : 0.0);
  }

  // What rank r could run next: per local stage its next F, I/B and W whose
  // inputs are known, into `cands` (cleared). Sets *f_blocked when a forward
  // is held back by memory.
  void Candidates(int r, std::vector<Candidate>& cands, bool* f_blocked) const {
    const int S = sh_.num_virtual, m = sh_.m;
    const int local_count = static_cast<int>(sh_.local[r].size());
    cands.clear();
    for (int s : sh_.local[r]) {
      if (next_f_[s] < m) {
        const int mb = next_f_[s];
        double ready =
            s == 0 ? 0 : (f_end_[s - 1][mb] < 0 ? kUnknown : Arrival(s - 1, s, f_end_[s - 1][mb]));
        if (ready >= 0) {
          bool allowed;
          if (f_done_[r][mb] > 0) {
            allowed = true;  // its room is reserved
          } else {
            allowed =
                mem_[r] + owed_[r] + local_count <= sh_.cap + kEps && inflight_[r] < limit_[r];
          }
          if (!allowed) *f_blocked = true;
          cands.push_back({ready, kF, s, mb, allowed});
        }
      }
      if (next_b_[s] < m) {
        const int mb = next_b_[s];
        if (f_end_[s][mb] >= 0) {
          double ready = f_end_[s][mb];
          if (s + 1 < S) {
            ready = b_end_[s + 1][mb] < 0 ? kUnknown
                                          : std::max(ready, Arrival(s + 1, s, b_end_[s + 1][mb]));
          }
          if (ready >= 0) cands.push_back({ready, kIB, s, next_b_[s], true});
        }
      }
      if (sh_.split && next_w_[s] < next_b_[s]) {
        cands.push_back({b_end_[s][next_w_[s]], kW, s, next_w_[s], true});
      }
    }
  }

  // Rank r's offers under the variant's rules, in candidate order, and the
  // earliest start among them. They depend on r's own state and on the ends
  // of its stages' neighbours, so only the ranks Execute marks change them.
  void RefreshOffers(int r) {
    const int S = sh_.num_virtual;
    bool f_blocked = false;
    Candidates(r, cands_, &f_blocked);
    std::vector<Offer>& offers = offers_[r];
    offers.clear();
    earliest_[r] = std::numeric_limits<double>::infinity();
    for (const Candidate& c : cands_) {
      if (!c.allowed) continue;
      const double start = std::max(free_at_[r], c.ready);
      int cls;
      if (c.kind == kW) {
        const bool owed_w = var_.w_delay_factor > 0 && pending_w_[r] > var_.w_delay_factor * r;
        cls = f_blocked || owed_w ? -1 : 2;
        if (var_.hold_w && cls == 2) {
          const double w_end = start + sh_.cost[c.stage].weight * sh_.mb_mult[c.mb];
          bool delays = false;
          for (const Candidate& o : cands_) {
            if (o.kind != kW && o.allowed && o.ready > start + kEps && o.ready < w_end - kEps) {
              delays = true;
            }
          }
          if (delays) continue;
        }
      } else if (c.kind == kIB) {
        cls = var_.backward_first ? 0 : 1;
      } else {
        cls = var_.backward_first ? 1 : 0;
      }
      const int tie =
          c.mb * S +
          ((c.kind == kF && var_.depth_first) || c.kind == kIB ? S - 1 - c.stage : c.stage);
      offers.push_back({start, cls, tie, c.stage, c.kind});
      earliest_[r] = std::min(earliest_[r], start);
    }
  }

  // Offers one of rank r's actions to `best`: an earlier start wins; at an
  // equal start (within kEps) the smaller (class, tie, rank).
  static void Consider(const Offer& o, int r, Choice& best) {
    if (o.start >= best.start + kEps) return;
    if (o.start < best.start - kEps || o.cls < best.cls ||
        (o.cls == best.cls && (o.tie < best.tie || (o.tie == best.tie && r < best.rank)))) {
      best = {o.start, o.cls, o.tie, r, o.stage, o.kind};
    }
  }

  // Runs the chosen action: appends it to its rank and updates the state.
  void Execute(const Choice& choice) {
    const int r = choice.rank, s = choice.stage;
    const double start = choice.start;
    const StageCost& c = sh_.cost[s];
    // What changes offers: r's own state, and the end that the next stage's
    // forward (after an F) or the previous stage's backward (after an I/B)
    // waits for.
    dirty_.push_back(r);
    const int neighbour = choice.kind == kF ? s + 1 : choice.kind == kIB ? s - 1 : -1;
    if (neighbour >= 0 && neighbour < sh_.num_virtual && sh_.placement[neighbour] != r) {
      dirty_.push_back(sh_.placement[neighbour]);
    }
    if (choice.kind == kF) {
      const int mb = next_f_[s]++;
      if (f_done_[r][mb] == 0) {
        owed_[r] += static_cast<int>(sh_.local[r].size());
        ++inflight_[r];
      }
      ++f_done_[r][mb];
      --owed_[r];
      mem_[r] += 1;
      free_at_[r] = f_end_[s][mb] = start + c.forward * sh_.mb_mult[mb];
      ranks_[r].push_back(F(s, mb));
    } else if (choice.kind == kIB) {
      const int mb = next_b_[s]++;
      mem_[r] -= sh_.split ? sh_.input_fraction : 1.0;
      if (sh_.split) ++pending_w_[r];
      if (++b_done_[r][mb] == static_cast<int>(sh_.local[r].size())) --inflight_[r];
      free_at_[r] = b_end_[s][mb] = start + (sh_.split ? c.input : c.backward) * sh_.mb_mult[mb];
      ranks_[r].push_back(sh_.split ? I(s, mb) : B(s, mb));
    } else {
      const int mb = next_w_[s]++;
      mem_[r] -= 1.0 - sh_.input_fraction;
      --pending_w_[r];
      free_at_[r] = start + c.weight * sh_.mb_mult[mb];
      ranks_[r].push_back(W(s, mb));
    }
  }

  const Shape& sh_;
  const Variant& var_;
  std::vector<std::vector<double>> f_end_, b_end_;  // per (stage, mb); kUnknown until run
  std::vector<int> next_f_, next_b_, next_w_;       // per stage: next micro-batch
  std::vector<double> free_at_, mem_;               // per rank
  std::vector<int> owed_;  // local forwards still owed by micro-batches already in
  std::vector<std::vector<int>> f_done_, b_done_;  // per (rank, mb): local stages done
  std::vector<int> inflight_;                      // micro-batches in, not all local backwards done
  std::vector<int> pending_w_;
  std::vector<int> limit_;  // in-flight limit per rank
  RankActions ranks_;
  std::vector<std::vector<Offer>> offers_;  // per rank, while not dirty
  std::vector<double> earliest_;            // per rank: its earliest offer
  std::vector<int> dirty_;                  // ranks whose offers are stale
  std::vector<Candidate> cands_;            // scratch of RefreshOffers
};

std::optional<RankActions> ListSchedule(const Shape& sh, const Variant& var) {
  return ListScheduler(sh, var).Run();
}

// ---------------------------------------------------------------------------
// Starts from registered schedules.

// B -> I, W (split) or I -> B and no W (not split); OVERLAP_F_B pairs keep
// their forward half paired (with I in place of B when split).
std::vector<Action> ConvertBackward(const std::vector<Action>& actions, bool split) {
  std::vector<Action> out;
  for (const Action& a : actions) {
    if (a.type == ActionType::kOverlapFB) {
      Action pair = a;
      if (split && pair.backward_type == ActionType::kBackward) {
        pair.backward_type = ActionType::kBackwardInput;
        out.push_back(pair);
        out.push_back(W(a.backward_stage, a.backward_microbatch));
      } else if (!split && pair.backward_type == ActionType::kBackwardInput) {
        pair.backward_type = ActionType::kBackward;
        out.push_back(pair);
      } else {
        out.push_back(pair);
      }
      continue;
    }
    if (split && a.type == ActionType::kBackward) {
      out.push_back(I(a.stage, a.microbatch));
      out.push_back(W(a.stage, a.microbatch));
    } else if (!split && a.type == ActionType::kBackwardInput) {
      out.push_back(B(a.stage, a.microbatch));
    } else if (!split && a.type == ActionType::kBackwardWeight) {
      continue;
    } else {
      out.push_back(a);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Evaluation and local search.

struct Evaluated {
  bool ok = false;
  double makespan = 0;
  double peak = 0;
};

Schedule ToSchedule(const Shape& sh, const std::string& name, RankActions ranks) {
  Schedule schedule;
  schedule.name = name;
  schedule.num_stages = sh.p;
  schedule.num_microbatches = sh.m;
  schedule.num_chunks = sh.v;
  schedule.stage_to_rank = sh.placement;
  schedule.ranks = std::move(ranks);
  return schedule;
}

// Same-rank order rules of the validator for one rank's list: per (stage,
// mb) F before I/B before W, and between local neighbour stages of one
// micro-batch F(s) before F(s + 1), I/B(s + 1) before I/B(s). Cross-rank
// order is the simulator's check (deadlock).
bool RankOrderOk(const Shape& sh, const std::vector<Action>& actions) {
  const int S = sh.num_virtual, m = sh.m;
  std::vector<int> pos_f(S * m, -1), pos_b(S * m, -1), pos_w(S * m, -1);
  int pos = 0;
  for (const Action& pair : actions) {
    for (const Action& a : Leaves(pair)) {
      const int k = a.stage * m + a.microbatch;
      if (a.type == ActionType::kForward) {
        pos_f[k] = pos;
      } else if (a.type == ActionType::kBackwardWeight) {
        pos_w[k] = pos;
      } else {
        pos_b[k] = pos;
      }
    }
    ++pos;
  }
  for (const Action& pair : actions) {
    for (const Action& a : Leaves(pair)) {
      const int k = a.stage * m + a.microbatch;
      if (pos_f[k] < 0 || pos_b[k] < 0) return false;
      if (pos_f[k] > pos_b[k]) return false;
      if (pos_w[k] >= 0 && pos_w[k] < pos_b[k]) return false;
      if (pos_f[k] == pos_b[k] && a.type == ActionType::kOverlapFB) return false;
      if (a.stage + 1 < S && sh.placement[a.stage + 1] == sh.placement[a.stage]) {
        const int n = k + m;
        if (pos_f[n] >= 0 && pos_f[n] < pos_f[k]) return false;
        if (pos_b[n] >= 0 && pos_b[n] > pos_b[k]) return false;
      }
    }
  }
  return true;
}

class Evaluator {
 public:
  Evaluator(const Shape& sh, const SimulationCosts& costs, const std::string& name,
            bool defer_receives)
      : sh_(sh), costs_(costs), name_(name), defer_receives_(defer_receives) {}
  Evaluated operator()(const RankActions& ranks) {
    ++count_;
    Evaluated out;
    absl::StatusOr<SimulationResult> sim =
        SimulateFiguresAsExecuted(ToSchedule(sh_, name_, ranks), costs_, defer_receives_);
    if (!sim.ok()) return out;
    out.makespan = sim->makespan;
    for (double x : sim->peak_memory) out.peak = std::max(out.peak, x);
    out.ok = out.peak <= sh_.cap + kEps;
    return out;
  }
  int count() const { return count_; }

 private:
  const Shape& sh_;
  const SimulationCosts& costs_;
  const std::string& name_;
  const bool defer_receives_;
  int count_ = 0;
};

struct Start {
  std::string name;
  RankActions ranks;
  Evaluated eval;
};

// Deterministic integers from the generator (no distribution objects, whose
// output the standard leaves to the library).
int Uniform(std::mt19937_64& rng, int n) {
  return static_cast<int>(rng() % static_cast<uint64_t>(n));
}

void LocalSearch(const Shape& sh, Evaluator& evaluate, int budget, std::mt19937_64& rng,
                 RankActions& ranks, Evaluated& current) {
  RankActions best = ranks;
  Evaluated best_eval = current;
  int since_best = 0;
  for (int it = 0; it < budget; ++it) {
    const int r = Uniform(rng, sh.p);
    std::vector<Action>& list = ranks[r];
    const int n = static_cast<int>(list.size());
    if (n < 2) continue;
    // Mostly move a W or an F (the movable work and the warm-up depth).
    int i = Uniform(rng, n);
    for (int tries = 0; tries < 3 && list[i].type == ActionType::kBackwardInput; ++tries) {
      i = Uniform(rng, n);
    }
    const int reach = 1 + Uniform(rng, std::min(n - 1, 8));
    int j = i + (Uniform(rng, 2) == 0 ? -reach : reach);
    j = std::clamp(j, 0, n - 1);
    if (j == i) continue;
    const Action moved = list[i];
    list.erase(list.begin() + i);
    list.insert(list.begin() + j, moved);
    Evaluated e;
    if (RankOrderOk(sh, list)) e = evaluate(ranks);
    if (e.ok && (e.makespan < current.makespan - kEps ||
                 (e.makespan < current.makespan + kEps && e.peak <= current.peak + kEps))) {
      current = e;
      if (e.makespan < best_eval.makespan - kEps) {
        best = ranks;
        best_eval = e;
        since_best = 0;
      }
    } else {
      list.erase(list.begin() + j);
      list.insert(list.begin() + i, moved);
    }
    // Wandered along a plateau for long: back to the best.
    if (++since_best > 200) {
      ranks = best;
      current = best_eval;
      since_best = 0;
    }
  }
  if (best_eval.makespan < current.makespan - kEps) {
    ranks = best;
    current = best_eval;
  }
}

absl::StatusOr<double> CheckedCap(const SynthesisOptions& o) {
  const double cap = o.memory_cap.value_or(DefaultCap(o));
  const double minimum = MinimumMemoryCap(o);
  if (!std::isfinite(cap) || cap < minimum - kEps) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_cap (", cap, ") is below the minimum any schedule needs: ", minimum,
                     " (one micro-batch's activations on each of a rank's ", minimum,
                     " local stages; units: one virtual stage's activations for one micro-batch)"));
  }
  return cap;
}

}  // namespace

double MinimumMemoryCap(const SynthesisOptions& options) {
  return options.placement == SynthesisPlacement::kV ? 2 : std::max(1, options.num_chunks);
}

absl::StatusOr<SynthesisResult> SynthesisLowerBound(const SynthesisOptions& o) {
  PP_RETURN_IF_ERROR(CheckShape(o));
  const Shape sh = MakeShape(o, 0);
  SynthesisResult out;
  auto backward = [&](int s) {
    return sh.split ? sh.cost[s].input + sh.cost[s].weight : sh.cost[s].backward;
  };
  // Variable micro-batches: the rank's work sums every micro-batch's; the
  // single micro-batch terms take the cheapest, which keeps them bounds.
  double total = 0;
  for (double x : sh.mb_mult) total += x;
  const double least = *std::min_element(sh.mb_mult.begin(), sh.mb_mult.end());
  for (int r = 0; r < sh.p; ++r) {
    const int first = sh.local[r].front();
    double head = 0;
    for (int s = 0; s < first; ++s) {
      head += least * sh.cost[s].forward + (sh.placement[s] != sh.placement[s + 1] ? sh.comm : 0);
    }
    double work = 0;
    for (int s : sh.local[r]) work += total * (sh.cost[s].forward + backward(s));
    out.rank_work_bound = std::max(out.rank_work_bound, head + work);
  }
  // The last of stage 0's m forwards ends at m F_0 or later; its micro-batch
  // then goes through every stage and back (and W of stage 0 after its I).
  double path = total * sh.cost[0].forward;
  for (int s = 0; s < sh.num_virtual; ++s) {
    if (s > 0) path += least * sh.cost[s].forward;
    path += least * (sh.split ? sh.cost[s].input : sh.cost[s].backward);
    if (s + 1 < sh.num_virtual && sh.placement[s] != sh.placement[s + 1]) path += 2 * sh.comm;
  }
  if (sh.split) path += least * sh.cost[0].weight;
  out.critical_path_bound = path;
  out.lower_bound = std::max(out.rank_work_bound, out.critical_path_bound);
  return out;
}

namespace {

// Synthesize's steps: check the extra starts, make and rank every start,
// search from the best few, and describe the result.

absl::Status CheckExtraStarts(const SynthesisOptions& o, const Shape& sh) {
  for (const Schedule& extra : o.extra_starts) {
    if (extra.num_stages != sh.p || extra.num_microbatches != sh.m || extra.num_chunks != sh.v ||
        extra.stage_to_rank != sh.placement || extra.forward_only) {
      return absl::InvalidArgumentError(absl::StrCat(
          "extra start '", extra.name, "' has p=", extra.num_stages, " m=", extra.num_microbatches,
          " v=", extra.num_chunks, " or another placement; the synthesis asks for p=", sh.p,
          " m=", sh.m, " v=", sh.v));
    }
  }
  return absl::OkStatus();
}

// The list-scheduling variants tried: all of them, or two.
std::vector<Variant> ListVariants(const SynthesisOptions& o, const Shape& sh) {
  if (!o.all_variants) return {{true, true, 1.0, true, 1}, {true, false, 0.0, true, 0}};
  std::vector<Variant> variants;
  for (bool backward_first : {true, false}) {
    for (bool hold_w : {true, false}) {
      for (bool depth_first : {true, false}) {
        if (!depth_first && sh.v == 1) continue;  // same order with one local stage
        for (double factor : {0.0, 1.0, 1.5, 2.0, 3.0}) {
          for (int w_delay : {0, 1, 2}) {
            if (!sh.split && w_delay > 0) continue;
            variants.push_back({backward_first, hold_w, factor, depth_first, w_delay});
          }
        }
      }
    }
  }
  return variants;
}

// The extra starts, then (when asked) every registered schedule of this
// shape and placement.
std::vector<Schedule> ScheduleStarts(const SynthesisOptions& o, const Shape& sh) {
  std::vector<Schedule> registered = o.extra_starts;
  if (!o.seed_with_registered) return registered;
  ScheduleOptions so;
  so.num_stages = sh.p;
  so.num_microbatches = sh.m;
  so.num_chunks = sh.v;
  for (const std::string& name : RegisteredScheduleNames()) {
    if (absl::StartsWith(name, "synth")) continue;
    absl::StatusOr<Schedule> made = MakeSchedule(name, so);
    // Vocabulary passes are placed after synthesis (AddVocabularyPasses), not
    // searched over.
    if (!made.ok() || made->forward_only || made->vocab_parallel ||
        made->stage_to_rank != sh.placement) {
      continue;
    }
    registered.push_back(*std::move(made));
  }
  return registered;
}

// Step 1: list-scheduling variants, then the schedule starts, evaluated; the
// ones within the cap, best (makespan, then peak) first.
absl::StatusOr<std::vector<Start>> RankedStarts(const SynthesisOptions& o, const Shape& sh,
                                                Evaluator& evaluate) {
  std::vector<Start> starts;
  for (const Variant& var : ListVariants(o, sh)) {
    std::optional<RankActions> ranks = ListSchedule(sh, var);
    if (!ranks) continue;
    starts.push_back({VariantName(var), std::move(*ranks), {}});
  }
  for (const Schedule& schedule : ScheduleStarts(o, sh)) {
    // As given (a schedule may mix B with I/W), and with the backward
    // converted to this synthesis' form.
    RankActions ranks;
    for (const auto& actions : schedule.ranks) ranks.push_back(ConvertBackward(actions, sh.split));
    if (sh.split && ranks != schedule.ranks) {
      starts.push_back({absl::StrCat("seed:", schedule.name), schedule.ranks, {}});
      starts.push_back({absl::StrCat("seed:", schedule.name, "(split)"), std::move(ranks), {}});
    } else {
      starts.push_back({absl::StrCat("seed:", schedule.name), std::move(ranks), {}});
    }
  }
  for (Start& start : starts) start.eval = evaluate(start.ranks);
  starts.erase(
      std::remove_if(starts.begin(), starts.end(), [](const Start& s) { return !s.eval.ok; }),
      starts.end());
  if (starts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no schedule found within memory_cap ", sh.cap, " at p=", sh.p, " m=", sh.m,
                     " v=", sh.v, " (the minimum is ", MinimumMemoryCap(o), "): raise the cap"));
  }
  std::stable_sort(starts.begin(), starts.end(), [](const Start& a, const Start& b) {
    return std::make_pair(a.eval.makespan, a.eval.peak) <
           std::make_pair(b.eval.makespan, b.eval.peak);
  });
  return starts;
}

struct SearchResult {
  int start_index = 0;  // which start it came from
  RankActions ranks;
};

// Step 2: local search from the best few starts, the budget split evenly.
// A start already at the lower bound is not searched.
SearchResult SearchFromBestStarts(const SynthesisOptions& o, const Shape& sh,
                                  const std::vector<Start>& starts, double lower_bound,
                                  Evaluator& evaluate) {
  std::mt19937_64 rng(o.seed);
  const int restarts = std::min<int>(3, starts.size());
  SearchResult best{0, starts[0].ranks};
  Evaluated best_eval = starts[0].eval;
  for (int k = 0; k < restarts && o.max_evaluations > 0; ++k) {
    RankActions ranks = starts[k].ranks;
    Evaluated eval = starts[k].eval;
    if (eval.makespan <= lower_bound + kEps) continue;  // optimal already
    LocalSearch(sh, evaluate, o.max_evaluations / restarts, rng, ranks, eval);
    if (eval.makespan < best_eval.makespan - kEps) {
      best_eval = eval;
      best.ranks = std::move(ranks);
      best.start_index = k;
    }
  }
  return best;
}

}  // namespace

absl::StatusOr<SynthesisResult> Synthesize(const SynthesisOptions& o) {
  PP_ASSIGN_OR_RETURN(SynthesisResult bounds, SynthesisLowerBound(o));
  PP_ASSIGN_OR_RETURN(const double cap, CheckedCap(o));
  const Shape sh = MakeShape(o, cap);
  PP_RETURN_IF_ERROR(CheckExtraStarts(o, sh));
  Evaluator evaluate(sh, o.costs, o.name, o.defer_receives);
  PP_ASSIGN_OR_RETURN(const std::vector<Start> starts, RankedStarts(o, sh, evaluate));
  SearchResult best = SearchFromBestStarts(o, sh, starts, bounds.lower_bound, evaluate);

  SynthesisResult out = bounds;
  out.schedule = ToSchedule(sh, o.name, std::move(best.ranks));
  absl::Status valid = ValidateSchedule(out.schedule);
  if (!valid.ok()) {
    return absl::InternalError(
        absl::StrCat("synthesised schedule fails validation (a bug): ", valid.message()));
  }
  PP_ASSIGN_OR_RETURN(out.simulation, SimulateAsExecuted(out.schedule, o.costs, o.defer_receives));
  out.makespan = out.simulation.makespan;
  out.memory_cap = cap;
  for (double x : out.simulation.peak_memory) out.peak_memory = std::max(out.peak_memory, x);
  out.start = starts[best.start_index].name;
  out.start_makespan = starts[best.start_index].eval.makespan;
  out.evaluations = evaluate.count();
  return out;
}

}  // namespace pp
