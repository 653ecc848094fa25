// bench_pipeline: what the pipeline runtime costs and what it buys.
//
//   ./bazelw run //bench:bench_pipeline            # all parts, defaults below
//   ./bazelw run //bench:bench_pipeline -- --steps=6 --rows=32
//
// Model: `--blocks` MLP blocks (Linear(hidden, hidden) + ReLU, hidden 1024),
// MSE loss, SGD; the same deterministic batches everywhere.
//  (a) overhead: the Trainer with pp=1 vs a hand-written LibTorch loop, both
//      one intra-op thread, steps interleaved so that machine load hits both.
//  (b) pp=2: two processes from the launcher (one thread each), 1F1B with
//      m=8, vs the sequential loop with 1 and with 2 threads; and vs the
//      simulator's bound for the forward/backward costs measured in the run.
//  (c) the simulator's predicted step time vs the measured one, with per
//      message costs from (d) and the step's measured tail (optimizer).
//  (d) Gloo ping-pong between two processes over message sizes; a least-
//      squares fit of latency + bytes / bandwidth (FitMessageCost).
// Prints one table and one JSON line. Rank 0 of (b) writes the measured
// Chrome trace to --trace_file.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/bench_common.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/optimizer.h"
#include "pipeline/runtime/p2p.h"
#include "pipeline/runtime/stage_executor.h"
#include "pipeline/runtime/trainer.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/ir/action.h"
#include "pipeline/schedule/ir/defer_receives.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/schedules/registry.h"
#include "topology/launcher.h"
#include "topology/parallel_grid.h"
#include "topology/process_topology.h"
#include "topology/rendezvous.h"

ABSL_FLAG(int, hidden, 1024, "Width of the MLP blocks.");
ABSL_FLAG(int, blocks, 8, "Number of MLP blocks (layers).");
ABSL_FLAG(int, rows, 32, "Rows (samples) per micro-batch.");
ABSL_FLAG(int, microbatches, 8, "Micro-batches per step.");
ABSL_FLAG(int, steps, 5, "Timed steps per measurement (after one warm-up step).");
ABSL_FLAG(std::string, schedule, "1f1b", "Schedule for part (b).");
ABSL_FLAG(std::string, role, "", "Internal: 'pp2' for the workers of part (b).");
ABSL_FLAG(std::string, result_file, "",
          "Internal: where rank 0 of part (b) writes its measurements.");
ABSL_FLAG(std::string, trace_file, "/tmp/bench_pipeline_trace.json",
          "Chrome trace of part (b)'s last step.");
ABSL_FLAG(bool, overhead_only, false, "Run only part (a) and print its ratio.");
ABSL_FLAG(std::vector<std::string>, pingpong_bytes,
          std::vector<std::string>({"512", "4096", "32768", "131072", "524288", "2097152"}),
          "Part (d): message sizes in bytes (multiples of 4).");
ABSL_FLAG(int64_t, pingpong_p2p_bytes, 131072,
          "Part (d): payload of the round trips through P2P (both send modes).");
ABSL_FLAG(int, pingpong_reps, 40, "Part (d): round trips per size (after 5 warm-up ones).");
ABSL_FLAG(int, timeout_s, 300, "Timeout for every receive and collective.");
namespace pp {
namespace {

constexpr uint64_t kSeed = 7;
using Clock = std::chrono::steady_clock;

class BlockImpl : public LayerImpl {
 public:
  explicit BlockImpl(int64_t hidden) : LayerImpl("Block") {
    linear_ = register_module("linear", torch::nn::Linear(hidden, hidden));
  }
  Activations Forward(const Activations& in, const MicroBatch&) override {
    return {torch::relu(linear_(in[0]))};
  }

 private:
  torch::nn::Linear linear_{nullptr};
};

std::vector<LayerSpec> Specs() {
  const int64_t hidden = absl::GetFlag(FLAGS_hidden);
  std::vector<LayerSpec> specs;
  for (int i = 0; i < absl::GetFlag(FLAGS_blocks); ++i) {
    specs.push_back(LayerSpec(
        "Block", [hidden](const LayerContext&) { return std::make_shared<BlockImpl>(hidden); }));
  }
  return specs;
}

torch::Tensor Loss(const Activations& out, const MicroBatch& batch) {
  return torch::mse_loss(out[0], batch.Get("target"));
}

// Deterministic batches; generated once and cached so that data generation
// does not enter any timing.
class Source : public MicroBatchSource {
 public:
  absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override {
    const int64_t key = step * 1000 + index;
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    torch::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(key + 1));
    const int64_t rows = absl::GetFlag(FLAGS_rows), hidden = absl::GetFlag(FLAGS_hidden);
    MicroBatchData d;
    d.inputs = {torch::randn({rows, hidden}, gen)};
    d.batch.id = key;
    d.batch.tensors["target"] = torch::randn({rows, hidden}, gen) * 0.1;
    return cache_.emplace(key, d).first->second;
  }
  void Prefetch(int64_t first_step, int64_t steps) {
    for (int64_t s = first_step; s < first_step + steps; ++s) {
      for (int i = 0; i < absl::GetFlag(FLAGS_microbatches); ++i) (void)Get(s, i);
    }
  }

 private:
  std::map<int64_t, MicroBatchData> cache_;
};

OptimizerConfig Sgd() {
  OptimizerConfig c;
  c.name = "sgd";
  c.lr = 0.01;
  return c;
}

// The hand-written loop: what a user would write without pipe.
class HandLoop {
 public:
  HandLoop() {
    model_ = *BuildSequential(Specs(), kSeed);
    optimizer_ = MakeOptimizer(Sgd(), model_->parameters());
  }
  double Step(int64_t step) {
    const auto t0 = Clock::now();
    const int m = absl::GetFlag(FLAGS_microbatches);
    optimizer_->zero_grad();
    for (int i = 0; i < m; ++i) {
      MicroBatchData d = *source_.Get(step, i);
      torch::Tensor loss = Loss(model_->Forward(d.inputs, d.batch), d.batch);
      (loss / static_cast<double>(m)).backward();
    }
    optimizer_->step();
    return Seconds(t0, Clock::now());
  }
  Source& source() { return source_; }

 private:
  StageModule model_{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  Source source_;
};

struct Engine {
  World world;
  std::unique_ptr<ParallelGrid> grid;
  std::unique_ptr<PipelineModel> model;
  Source source;
  std::unique_ptr<Trainer> trainer;
};

absl::Status MakeEngine(const World& world, int pp, Engine& e) {
  e.world = world;
  PP_ASSIGN_OR_RETURN(ProcessTopology topo, PipeDataParallelTopology(pp, 1));
  PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, topo));
  e.grid = std::make_unique<ParallelGrid>(std::move(grid));
  PipelineModelOptions mo;
  mo.num_stages = pp;
  mo.partition_method = "uniform";
  mo.base_seed = kSeed;
  PP_ASSIGN_OR_RETURN(e.model, PipelineModel::Create(Specs(), mo, e.grid->stage_id()));
  TrainerOptions to;
  to.schedule = absl::GetFlag(FLAGS_schedule);
  to.num_microbatches = absl::GetFlag(FLAGS_microbatches);
  to.optimizer = Sgd();
  to.executor.p2p.timeout = std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s));
  // The hand-written loop computes no gradient norm; neither does the engine
  // here, so (a) measures the engine itself.
  to.report_grad_norm = false;
  PP_ASSIGN_OR_RETURN(e.trainer, Trainer::Create(e.grid.get(), e.model.get(), Loss, &e.source, to));
  return absl::OkStatus();
}

absl::StatusOr<World> LocalWorld(int rank, int size, const std::string& store) {
  DistEnv env;
  env.rank = rank;
  env.world_size = size;
  RendezvousOptions ro;
  ro.timeout = std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s));
  ro.file_store_path = store;
  return Rendezvous(env, ro);
}

// Part (b) worker: one of two launcher-started processes.
absl::Status RunPp2Worker() {
  PP_ASSIGN_OR_RETURN(World world, RendezvousFromEnv(RendezvousOptions{}));
  SetBenchThreads(1);
  SetBlasThreads(1);
  Engine e;
  PP_RETURN_IF_ERROR(MakeEngine(world, world.size, e));
  const int steps = absl::GetFlag(FLAGS_steps);
  e.source.Prefetch(0, steps + 1);
  std::vector<double> times;
  std::string trace;
  for (int s = 0; s <= steps; ++s) {
    const auto t0 = Clock::now();
    // Traced with busy/idle, as the part's figures need (their cost is in t).
    PP_ASSIGN_OR_RETURN(StepResult r, e.trainer->Step({.trace = true, .busy_idle = true}));
    const double t = Seconds(t0, Clock::now());
    if (s > 0) times.push_back(t);
    // Every timed step's trace: per-stage F/B costs for the simulator.
    if (s > 0) {
      PP_ASSIGN_OR_RETURN(std::string json, e.trainer->LastStepTrace());
      trace = json;
      if (world.rank == 0) {
        nlohmann::json doc = nlohmann::json::parse(json);
        static std::map<std::string, std::vector<double>> durations;
        static std::map<int, std::vector<double>> tails;  // per rank, per step
        std::map<int, double> tail;
        for (const auto& ev : doc["traceEvents"]) {
          if (!ev.contains("dur") || !ev.contains("name")) continue;
          absl::StatusOr<Action> a = ParseAction(ev["name"].get<std::string>());
          if (a.ok() && IsTail(a->type)) {
            tail[ev["tid"].get<int>()] += ev["dur"].get<double>() * 1e-6;
          }
          if (!a.ok() || !IsCompute(a->type)) continue;
          durations[absl::StrCat(a->stage, ActionTypeName(a->type))].push_back(
              ev["dur"].get<double>() * 1e-6);
        }
        for (const auto& [rank, t] : tail) tails[rank].push_back(t);
        if (s == steps) {
          nlohmann::json out;
          out["step_seconds"] = times;
          // The step's tail (waiting for sends, gradient reduction, optimizer)
          // is outside the simulator's schedule: the slowest rank's mean.
          double tail_s = 0;
          for (auto& [rank, v] : tails) tail_s = std::max(tail_s, Mean(v));
          out["tail_seconds"] = tail_s;
          // Means, not medians: a step's length adds up every action,
          // slow outliers included.
          for (auto& [k, v] : durations) out["cost"][k] = Mean(v);
          out["busy"] = r.busy_seconds;
          out["idle"] = r.idle_seconds;
          std::ofstream(absl::GetFlag(FLAGS_result_file)) << out.dump();
        }
      }
    }
  }
  if (world.rank == 0) std::ofstream(absl::GetFlag(FLAGS_trace_file)) << trace;
  return absl::OkStatus();
}

// Part (d) worker: rank 0 sends each size to rank 1 and waits for it to come
// back; one-way time = half the round trip, median over the repetitions.
absl::Status RunPingPongWorker() {
  PP_ASSIGN_OR_RETURN(World world, RendezvousFromEnv(RendezvousOptions{}));
  SetBenchThreads(1);
  SetBlasThreads(1);
  if (world.size != 2) {
    return absl::InvalidArgumentError(absl::StrCat("ping-pong needs 2 ranks, got ", world.size));
  }
  const int peer = 1 - world.rank;
  const auto timeout = std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s));
  auto transfer = [&](torch::Tensor& t, bool send) -> absl::Status {
    return TorchCall(send ? "ping-pong send" : "ping-pong receive", [&] {
      std::vector<at::Tensor> one = {t};
      c10::intrusive_ptr<c10d::Work> work =
          send ? world.group->send(one, peer, 0) : world.group->recv(one, peer, 0);
      if (!work->wait(timeout)) throw std::runtime_error("aborted");
    });
  };
  nlohmann::json out;
  for (const std::string& text : absl::GetFlag(FLAGS_pingpong_bytes)) {
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(text, &bytes) || bytes < 4 || bytes % 4 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pingpong_bytes entry '", text,
                       "' must be a positive multiple of 4 (float32 payload)"));
    }
    torch::Tensor buffer = torch::zeros({bytes / 4});
    std::vector<double> one_way;
    const int reps = absl::GetFlag(FLAGS_pingpong_reps);
    for (int i = 0; i < reps + 5; ++i) {
      const auto t0 = Clock::now();
      PP_RETURN_IF_ERROR(transfer(buffer, /*send=*/world.rank == 0));
      PP_RETURN_IF_ERROR(transfer(buffer, /*send=*/world.rank == 1));
      if (i >= 5) one_way.push_back(Seconds(t0, Clock::now()) / 2);
    }
    out["bytes"].push_back(bytes);
    out["one_way_s"].push_back(Median(one_way));
  }
  // The same round trip through P2P (control word + payload per message).
  const int64_t p2p_bytes = absl::GetFlag(FLAGS_pingpong_p2p_bytes);
  if (p2p_bytes < 4 || p2p_bytes % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pingpong_p2p_bytes=", p2p_bytes, " must be a positive multiple of 4"));
  }
  std::map<std::string, std::vector<double>> p2p_one_way;
  std::map<std::string, double> post;
  std::map<std::string, int64_t> messages;
  for (int round = 0; round < 4; ++round) {
    {
      const std::string name = "direct";
      P2POptions options;
      options.timeout = timeout;
      P2P p2p(world.group, options);
      const Activations payload = {torch::zeros({p2p_bytes / 4})};
      const int reps = absl::GetFlag(FLAGS_pingpong_reps);
      for (int i = 0; i < reps + 5; ++i) {
        const auto t0 = Clock::now();
        if (world.rank == 0) {
          PP_RETURN_IF_ERROR(p2p.SendActivations(1, 0, 1, payload, "ping"));
          PP_ASSIGN_OR_RETURN(Activations back, p2p.RecvActivations(1, 1, 0, "pong"));
          p2p.Recycle(std::move(back));
        } else {
          PP_ASSIGN_OR_RETURN(Activations got, p2p.RecvActivations(0, 0, 1, "ping"));
          PP_RETURN_IF_ERROR(p2p.SendActivations(0, 1, 0, got, "pong"));
        }
        if (i >= 5) p2p_one_way[name].push_back(Seconds(t0, Clock::now()) / 2);
      }
      PP_RETURN_IF_ERROR(p2p.WaitSends());
      const P2PStats stats = p2p.stats();
      post[name] += stats.send_post_seconds;
      messages[name] += stats.tensor_messages;
    }
  }
  for (const auto& [name, v] : p2p_one_way) {
    out["p2p"][name] = {{"bytes", p2p_bytes},
                        {"one_way_s", Median(v)},
                        {"post_s_per_message", post[name] / messages[name]}};
  }
  if (world.rank == 0) std::ofstream(absl::GetFlag(FLAGS_result_file)) << out.dump();
  return absl::OkStatus();
}

// Runs two launcher-started workers of this binary with `role` and returns
// what rank 0 wrote to its result file.
absl::StatusOr<nlohmann::json> RunRole(const char* self, const std::string& role,
                                       const std::string& result_file,
                                       std::vector<std::string> extra) {
  LaunchOptions lo;
  lo.nproc_per_node = 2;
  std::vector<std::string> argv = {self, absl::StrCat("--role=", role),
                                   absl::StrCat("--result_file=", result_file),
                                   absl::StrCat("--timeout_s=", absl::GetFlag(FLAGS_timeout_s))};
  argv.insert(argv.end(), extra.begin(), extra.end());
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  PP_ASSIGN_OR_RETURN(int code, RunWorkers(lo, argv));
  if (code != 0) return absl::InternalError(absl::StrCat(role, " workers exited with ", code));
  std::ifstream in(result_file);
  std::stringstream ss;
  ss << in.rdbuf();
  ::unlink(result_file.c_str());
  return nlohmann::json::parse(ss.str());
}

// Part (a), the engine's overhead: the hand-written loop and the engine at
// pp = 1 with one thread, interleaved steps; then, unless --overhead_only,
// the loop with BLAS on both cores.
struct Overhead {
  double loop1 = 0, engine1 = 0;
  // Interference from other processes only ever adds time: the fastest step
  // of each is the least disturbed estimate of its cost.
  double loop1_min = 0, engine1_min = 0;
  double loop2 = 0;
};

absl::StatusOr<Overhead> MeasureOverhead(HandLoop& loop, Engine& engine, int steps) {
  loop.source().Prefetch(0, steps + 1);
  loop.source().Prefetch(100, steps + 1);
  engine.source.Prefetch(0, steps + 1);
  std::vector<double> loop_times, engine_times;
  for (int s = 0; s <= steps; ++s) {
    const double tl = loop.Step(s);
    const auto t0 = Clock::now();
    PP_ASSIGN_OR_RETURN(StepResult r, engine.trainer->Step());
    (void)r;
    const double te = Seconds(t0, Clock::now());
    if (s > 0) {
      loop_times.push_back(tl);
      engine_times.push_back(te);
    }
  }
  Overhead o;
  o.loop1 = Median(loop_times);
  o.engine1 = Median(engine_times);
  o.loop1_min = *std::min_element(loop_times.begin(), loop_times.end());
  o.engine1_min = *std::min_element(engine_times.begin(), engine_times.end());
  if (absl::GetFlag(FLAGS_overhead_only)) return o;

  // Sequential on both cores: BLAS with 2 threads (one intra-op thread, so
  // the two pools do not oversubscribe the cores).
  SetBlasThreads(2);
  std::vector<double> loop2_times;
  for (int s = 0; s <= steps; ++s) {
    const double t = loop.Step(100 + s);
    if (s > 0) loop2_times.push_back(t);
  }
  o.loop2 = Median(loop2_times);
  SetBlasThreads(1);
  return o;
}

// Part (d): the Gloo ping-pong's one-way times and the message cost fitted to
// them.
struct PingPong {
  nlohmann::json result;
  std::vector<MessageSample> samples;
  MessageCost message;
};

absl::StatusOr<PingPong> MeasurePingPong(const char* self, const std::string& tmp) {
  PingPong out;
  PP_ASSIGN_OR_RETURN(
      out.result,
      RunRole(self, "pingpong", tmp + "_pingpong.json",
              {absl::StrCat("--pingpong_bytes=",
                            absl::StrJoin(absl::GetFlag(FLAGS_pingpong_bytes), ",")),
               absl::StrCat("--pingpong_reps=", absl::GetFlag(FLAGS_pingpong_reps)),
               absl::StrCat("--pingpong_p2p_bytes=", absl::GetFlag(FLAGS_pingpong_p2p_bytes))}));
  for (size_t i = 0; i < out.result["bytes"].size(); ++i) {
    out.samples.push_back(
        {out.result["bytes"][i].get<double>(), out.result["one_way_s"][i].get<double>()});
  }
  PP_ASSIGN_OR_RETURN(out.message, FitMessageCost(out.samples));
  return out;
}

// Part (c): the simulator with pp2's measured per-stage costs.
struct Prediction {
  double f0 = 0, f1 = 0, b0 = 0, b1 = 0;  // measured per-micro-batch costs
  double bound = 0;                       // compute only, messages free, no tail
  double with_messages = 0;               // the schedule with the fitted message cost
  double tail = 0;                        // measured
  double predicted = 0;                   // with_messages + tail
};

absl::StatusOr<Prediction> Predict(const nlohmann::json& pp2, const MessageCost& message, int m) {
  ScheduleOptions so;
  so.num_stages = 2;
  so.num_microbatches = m;
  PP_ASSIGN_OR_RETURN(Schedule schedule, MakeSchedule(absl::GetFlag(FLAGS_schedule), so));
  PP_ASSIGN_OR_RETURN(LoweredProgram lowered, Lower(schedule));
  // The program the runtime executes (receives deferred to their consumers).
  const LoweredProgram program = DeferReceives(lowered);
  Prediction p;
  p.f0 = pp2["cost"]["0F"].get<double>();
  p.f1 = pp2["cost"]["1F"].get<double>();
  p.b0 = pp2["cost"]["0B"].get<double>();
  p.b1 = pp2["cost"]["1B"].get<double>();
  SimulationCosts costs;
  costs.forward = (p.f0 + p.f1) / 2;
  costs.backward = (p.b0 + p.b1) / 2;
  costs.stage_multiplier = {(p.f0 + p.b0) / (costs.forward + costs.backward),
                            (p.f1 + p.b1) / (costs.forward + costs.backward)};
  PP_ASSIGN_OR_RETURN(SimulationResult sim, SimulateProgram(program, costs));
  p.bound = sim.makespan;
  // The prediction: every SEND/RECV pair moves (dynamic-shape mode) a control
  // word and the activation, or its gradient, each costing the fitted model;
  // then the measured tail.
  const double payload_bytes = 4.0 * absl::GetFlag(FLAGS_rows) * absl::GetFlag(FLAGS_hidden);
  costs.message = message;
  costs.message_bytes = {payload_bytes, 8.0 * P2P::kControlWords};
  PP_ASSIGN_OR_RETURN(SimulationResult with_messages, SimulateProgram(program, costs));
  p.with_messages = with_messages.makespan;
  p.tail = pp2["tail_seconds"].get<double>();
  p.predicted = p.with_messages + p.tail;
  return p;
}

// The table of parts (a) to (d) and the JSON line.
void Report(const Overhead& o, const PingPong& pingpong, const nlohmann::json& pp2, double pp2_time,
            const Prediction& p, int m, int steps) {
  const double samples = static_cast<double>(m) * absl::GetFlag(FLAGS_rows);
  const MessageCost& message = pingpong.message;
  const double overhead_ratio = o.loop1 / o.engine1;  // engine throughput / loop throughput
  const double speedup1 = o.loop1 / pp2_time, speedup2 = o.loop2 / pp2_time;
  const double vs_bound = p.bound / pp2_time;
  const double prediction_error = (p.predicted - pp2_time) / pp2_time;

  std::printf(
      "\nbench_pipeline: %d x Linear(%d,%d)+ReLU, %d rows/micro-batch, m=%d, SGD, median of %d "
      "steps\n",
      absl::GetFlag(FLAGS_blocks), absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_hidden),
      absl::GetFlag(FLAGS_rows), m, steps);
  std::printf("%-46s %10s %12s %s\n", "run", "step (s)", "samples/s", "ratio");
  auto row = [&](const std::string& name, double t, const std::string& ratio) {
    std::printf("%-46s %10.4f %12.1f %s\n", name.c_str(), t, samples / t, ratio.c_str());
  };
  row("hand-written loop, 1 thread", o.loop1, "");
  row("hand-written loop, 2 BLAS threads", o.loop2, "");
  row("(a) pipe engine pp=1, 1 thread", o.engine1,
      absl::StrFormat("%.3fx loop; fastest steps %.3fx (target >= 0.98)", overhead_ratio,
                      o.loop1_min / o.engine1_min));
  row(absl::StrCat("(b) pipe engine pp=2 ", absl::GetFlag(FLAGS_schedule), ", 2 procs x 1 thread"),
      pp2_time,
      absl::StrFormat("%.2fx loop-1t, %.2fx loop-2t (target >= 1.7)", speedup1, speedup2));
  row("    simulator bound for measured F/B costs", p.bound,
      absl::StrFormat("measured = %.3fx bound (target >= 0.97)", vs_bound));
  std::printf(
      "(c) predicted step %.4f s (schedule %.4f s with fitted messages + measured tail %.4f s) "
      "vs measured %.4f s: %+.1f%% (target within 5%%)\n",
      p.predicted, p.with_messages, p.tail, pp2_time, 100 * prediction_error);
  std::printf("(d) Gloo ping-pong one-way: latency %.1f us + %.3f ns/byte (%.2f GB/s):",
              1e6 * message.latency, 1e9 * message.per_byte,
              message.per_byte > 0 ? 1e-9 / message.per_byte : 0.0);
  for (const MessageSample& m : pingpong.samples) {
    std::printf(" %.0fB %.1fus (fit %.1f)", m.bytes, 1e6 * m.seconds, 1e6 * message.Of(m.bytes));
  }
  std::printf("\n");
  for (const auto& [name, r] : pingpong.result["p2p"].items()) {
    std::printf(
        "    P2P round trip, %s sends: one-way %.1f us for %d bytes; per message: posting %.1f "
        "us\n",
        name.c_str(), 1e6 * r["one_way_s"].get<double>(), r["bytes"].get<int>(),
        1e6 * r["post_s_per_message"].get<double>());
  }
  std::printf("    measured per-micro-batch costs: F0 %.4f F1 %.4f B0 %.4f B1 %.4f s; trace: %s\n",
              p.f0, p.f1, p.b0, p.b1, absl::GetFlag(FLAGS_trace_file).c_str());
  nlohmann::json j;
  j["bench"] = "pipeline";
  j["blocks"] = absl::GetFlag(FLAGS_blocks);
  j["hidden"] = absl::GetFlag(FLAGS_hidden);
  j["rows"] = absl::GetFlag(FLAGS_rows);
  j["microbatches"] = m;
  j["loop_1t_s"] = o.loop1;
  j["loop_2t_s"] = o.loop2;
  j["engine_pp1_s"] = o.engine1;
  j["overhead_ratio"] = overhead_ratio;
  j["overhead_ratio_fastest"] = o.loop1_min / o.engine1_min;
  j["pp2_s"] = pp2_time;
  j["pp2_speedup_vs_loop_1t"] = speedup1;
  j["pp2_speedup_vs_loop_2t"] = speedup2;
  j["sim_bound_pp2_s"] = p.bound;
  j["sim_pp2_s"] = p.predicted;
  j["tail_s"] = p.tail;
  j["message_latency_s"] = message.latency;
  j["message_s_per_byte"] = message.per_byte;
  j["pingpong"] = pingpong.result;
  j["pp2_vs_sim_bound"] = vs_bound;
  j["sim_error"] = prediction_error;
  j["costs"] = pp2["cost"];
  std::printf("%s\n", j.dump().c_str());
}

absl::Status RunBenchmark(const char* self) {
  const int steps = absl::GetFlag(FLAGS_steps);
  const int m = absl::GetFlag(FLAGS_microbatches);
  const std::string tmp = absl::StrCat("/tmp/bench_pipeline_", getpid());

  // (a) Overhead at pp = 1, one thread, interleaved steps. OpenBLAS must be
  // told too: it sized its pool from the core count when it was loaded.
  SetBenchThreads(1);
  SetBlasThreads(1);
  HandLoop loop;
  Engine engine;
  PP_ASSIGN_OR_RETURN(World world1, LocalWorld(0, 1, tmp + "_store"));
  PP_RETURN_IF_ERROR(MakeEngine(world1, 1, engine));
  PP_ASSIGN_OR_RETURN(Overhead overhead, MeasureOverhead(loop, engine, steps));
  if (absl::GetFlag(FLAGS_overhead_only)) {
    std::printf(
        "(a) loop %.4f s, engine pp=1 %.4f s: engine = %.3fx loop throughput (fastest steps: "
        "%.3fx)\n",
        overhead.loop1, overhead.engine1, overhead.loop1 / overhead.engine1,
        overhead.loop1_min / overhead.engine1_min);
    return absl::OkStatus();
  }

  // (d) first: the message cost model (c) uses.
  PP_ASSIGN_OR_RETURN(PingPong pingpong, MeasurePingPong(self, tmp));

  // (b) pp = 2 through the launcher.
  PP_ASSIGN_OR_RETURN(nlohmann::json pp2,
                      RunRole(self, "pp2", tmp + "_pp2.json",
                              {absl::StrCat("--trace_file=", absl::GetFlag(FLAGS_trace_file)),
                               absl::StrCat("--hidden=", absl::GetFlag(FLAGS_hidden)),
                               absl::StrCat("--blocks=", absl::GetFlag(FLAGS_blocks)),
                               absl::StrCat("--rows=", absl::GetFlag(FLAGS_rows)),
                               absl::StrCat("--microbatches=", m), absl::StrCat("--steps=", steps),
                               absl::StrCat("--schedule=", absl::GetFlag(FLAGS_schedule))}));
  const double pp2_time = Median(pp2["step_seconds"].get<std::vector<double>>());

  // (c) Simulator with the measured per-stage costs.
  PP_ASSIGN_OR_RETURN(Prediction prediction, Predict(pp2, pingpong.message, m));
  Report(overhead, pingpong, pp2, pp2_time, prediction, m, steps);
  ::unlink((tmp + "_store").c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  if (std::getenv("RANK") != nullptr) {
    pp::MaybeLaunch(argc, argv);
    if (absl::GetFlag(FLAGS_role) == "pingpong") {
      return pp::ExitCode("bench_pipeline ping-pong worker", pp::RunPingPongWorker());
    }
    return pp::ExitCode("bench_pipeline worker", pp::RunPp2Worker());
  }
  absl::ParseCommandLine(argc, argv);
  return pp::ExitCode("bench_pipeline", pp::RunBenchmark("/proc/self/exe"));
}
