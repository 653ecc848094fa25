// Training checkpoints end to end on a small GPT with the real Trainer:
//  - exact resume: 2N steps straight == N steps, save, fresh processes load,
//    N more steps (per-step losses and final weights bitwise, AdamW, dropout on);
//  - reshard: save at pp=4 -> load at pp=2 (also interleaved, 2 chunks), pp=1
//    and ToSequential(); save at pp=2 x dp=2 -> load at pp=4 x dp=1; save
//    under zbv's V placement (pp=2, 2 chunks) -> load under interleaved_1f1b's
//    looped placement and back; save at tp=2 -> load at tp=1, tp=4 (vocabulary
//    padded) and ToSequential(), save at tp=4 -> load at tp=2 x pp=2; the
//    next step's loss matches;
//  - the distributed optimizer (ZeRO-1): exact resume (fp32 and bf16), and
//    dp 4 -> 2 -> 1 with it on, off, on continues an uninterrupted run;
//  - vocabulary parallelism: exact resume (fp32, bf16, with the distributed
//    optimizer); its checkpoint is the dense model's (tables whole), so it
//    loads into a run without it, at another pp and into ToSequential(), and
//    a dense run's loads into it.
//
// The resume test runs real worker processes (this binary re-executed with
// PP_CKPT_WORKER set), since dropout draws from the process-wide generator.
#include "checkpoint/model/trainer_checkpoint.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "models/data/lm_data.h"
#include "models/gpt/gpt.h"
#include "pipeline/runtime/model_parallel_group.h"
#include "pipeline/runtime/vocab_layers.h"
#include "pipeline/schedule/schedules/registry.h"
#include "topology/process_topology.h"
#include "topology/rendezvous.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

namespace fs = std::filesystem;

struct RunSpec {
  int pp = 1;
  int dp = 1;
  int tp = 1;
  int chunks = 1;
  std::string schedule = "1f1b";
  int global_microbatches = 4;
  double dropout = 0.0;
  Precision precision = Precision::kFp32;
  int num_heads = 2;
  bool distributed_optimizer = false;
  // The tables split over the pipe ranks (MakeGptVocabularySplit).
  bool vocab_parallel = false;
};

// The tokens are below 62: a vocabulary of 62 to 64 fits them.
GptModelConfig TinyGpt(double dropout, int num_heads = 2, int64_t vocab = 64) {
  GptModelConfig c;
  c.set_vocab_size(vocab);
  c.set_context_length(16);
  c.set_width(32);
  c.set_num_heads(num_heads);
  c.set_num_layers(4);
  c.set_mlp_ratio(2);
  c.set_dropout(dropout);
  return c;
}

// The global batch of a step as `global_microbatches` micro-batches: the same
// for any pp x dp (the runtime asks for global micro-batch indices).
absl::StatusOr<std::unique_ptr<LmBatchSource>> MakeSource(int global_microbatches) {
  std::vector<int64_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int64_t>((i * 31 + (i / 7) * 3) % 62);
  LmDataOptions o;
  o.seq_len = 16;
  o.micro_batch_size = 2;
  o.num_microbatches = global_microbatches;
  o.seed = 7;
  PP_ASSIGN_OR_RETURN(LmBatchSource source, LmBatchSource::Create(std::move(tokens), o));
  return std::make_unique<LmBatchSource>(std::move(source));
}

// One rank's training objects.
struct RankRun {
  std::unique_ptr<ParallelGrid> grid;
  std::unique_ptr<PipelineModel> model;
  std::unique_ptr<LmBatchSource> source;
  std::unique_ptr<VocabularyLayers> vocabulary;  // before the Trainer that uses it
  std::unique_ptr<Trainer> trainer;
};

// The tensor-parallel runs' vocabulary: split evenly at tp 2, padded to 64 at tp 4.
constexpr int64_t kTpVocab = 62;

absl::StatusOr<RankRun> MakeRun(const World& world, const RunSpec& spec) {
  RankRun run;
  PP_ASSIGN_OR_RETURN(ProcessTopology topo,
                      spec.tp > 1 ? PipeModelDataParallelTopology(spec.pp, spec.tp, spec.dp)
                                  : PipeDataParallelTopology(spec.pp, spec.dp));
  PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, topo));
  run.grid = std::make_unique<ParallelGrid>(std::move(grid));
  const int64_t vocab = spec.num_heads == 2 ? 64 : kTpVocab;
  const GptModelConfig config = TinyGpt(spec.dropout, spec.num_heads, vocab);
  PP_ASSIGN_OR_RETURN(std::vector<LayerSpec> specs, MakeGptSpecs(config));
  std::optional<VocabularySplit> split;
  if (spec.vocab_parallel) {
    PP_ASSIGN_OR_RETURN(split, MakeGptVocabularySplit(config));
    specs = split->body;
  }
  PipelineModelOptions mo;
  const ModelParallelGroup group = ModelParallelGroupOf(*run.grid, std::chrono::seconds(60));
  mo.layer_environment.model_parallel = group;
  mo.num_stages = spec.pp;
  mo.chunks = spec.chunks;
  mo.partition_method = "uniform";
  mo.base_seed = 99;
  // The schedule's placement of virtual stages (V for zbv).
  PP_ASSIGN_OR_RETURN(
      Schedule schedule,
      MakeSchedule(spec.schedule, {spec.pp, spec.global_microbatches / spec.dp, spec.chunks, 0}));
  mo.stage_to_rank = schedule.stage_to_rank;
  PP_ASSIGN_OR_RETURN(run.model, PipelineModel::Create(specs, mo, run.grid->stage_id()));
  PP_ASSIGN_OR_RETURN(run.source, MakeSource(spec.global_microbatches));
  TrainerOptions to;
  if (split) {
    PP_ASSIGN_OR_RETURN(run.vocabulary,
                        MakeVocabularyLayers(*split, mo.base_seed,
                                             PipeGroupOf(*run.grid, std::chrono::seconds(60))));
    to.vocabulary = run.vocabulary.get();
  }
  to.schedule = spec.schedule;
  to.num_microbatches = spec.global_microbatches / spec.dp;
  to.optimizer.name = "adamw";
  to.optimizer.lr = 3e-3;
  to.optimizer.weight_decay = 0.01;
  to.lr_schedule.name = "warmup_cosine";
  to.lr_schedule.warmup_steps = 2;
  to.lr_schedule.total_steps = 20;
  to.max_grad_norm = 1.0;
  to.executor.p2p.timeout = std::chrono::seconds(60);
  to.precision = spec.precision;
  to.distributed_optimizer = spec.distributed_optimizer;
  to.bucket_numel = 5000;  // several buckets per stage
  const LossFn loss = group.is_parallel()
                          ? LossFn([vocab, group](const Activations& out, const MicroBatch& batch) {
                              return GptParallelLoss(out, batch, vocab, group);
                            })
                          : LossFn(GptLoss);
  PP_ASSIGN_OR_RETURN(run.trainer,
                      Trainer::Create(run.grid.get(), run.model.get(), loss, run.source.get(), to));
  return run;
}

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return (fs::path(tmp ? tmp : "/tmp") / name).string();
}

// ---------------------------------------------------------------------------
// Worker process of the exact-resume test.
//   PP_CKPT_WORKER = straight (2N steps) | first (N steps, save) | second (load, N steps)

absl::Status WorkerMain() {
  at::set_num_threads(1);
  const std::string mode = std::getenv("PP_CKPT_WORKER");
  const std::string out = std::getenv("PP_CKPT_OUT");
  const int n = std::atoi(std::getenv("PP_CKPT_STEPS"));
  RendezvousOptions ro;
  ro.timeout = std::chrono::seconds(60);
  PP_ASSIGN_OR_RETURN(World world, RendezvousFromEnv(ro));
  RunSpec spec;
  spec.pp = 2;
  spec.dropout = 0.1;
  PP_ASSIGN_OR_RETURN(RankRun run, MakeRun(world, spec));
  at::manual_seed(1000 + world.rank);  // this rank's dropout stream
  const std::string root = out + "/ckpt";
  int steps = mode == "straight" ? 2 * n : n;
  if (mode == "second" || mode == "second_norng") {
    PP_ASSIGN_OR_RETURN(LoadReport report,
                        LoadTrainingCheckpoint(root, *run.grid, *run.model, *run.trainer));
    if (!report.rank_state_found) return absl::InternalError("rank state (RNG) not restored");
    if (run.trainer->step() != n)
      return absl::InternalError(absl::StrCat("step after load ", run.trainer->step()));
    // Negative control: forget the restored RNG state.
    if (mode == "second_norng") at::manual_seed(1000 + world.rank);
  }
  std::ofstream losses(absl::StrCat(out, "/", mode, "_losses_rank", world.rank, ".txt"));
  for (int i = 0; i < steps; ++i) {
    PP_ASSIGN_OR_RETURN(StepResult r, run.trainer->Step());
    losses << absl::StrFormat("%d %a\n", r.step, r.loss);
  }
  losses.close();
  if (mode == "first") {
    TrainingCheckpointOptions co;
    co.root = root;
    co.keep_last = 2;
    PP_RETURN_IF_ERROR(SaveTrainingCheckpoint(co, *run.grid, *run.model, *run.trainer).status());
  } else {
    ModelState state = ModelStateOf(*run.model);
    PP_RETURN_IF_ERROR(
        WriteTensorFile(out, absl::StrCat(mode, "_final_rank", world.rank, ".pt"), state.tensors)
            .status());
  }
  return absl::OkStatus();
}

// Starts `world` copies of this binary as workers of `mode`; waits (bounded).
void RunWorkers(const std::string& mode, const std::string& out, int n, int world) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setenv("PP_CKPT_WORKER", mode.c_str(), 1);
      setenv("PP_CKPT_OUT", out.c_str(), 1);
      setenv("PP_CKPT_STEPS", std::to_string(n).c_str(), 1);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(*port).c_str(), 1);
      setenv("OMP_NUM_THREADS", "1", 1);
      char* argv[] = {const_cast<char*>("/proc/self/exe"), nullptr};
      execv("/proc/self/exe", argv);
      _exit(127);
    }
    pids.push_back(pid);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    while (true) {
      pid_t r = waitpid(pids[i], &status, WNOHANG);
      if (r == pids[i]) break;
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) kill(p, SIGKILL);
        waitpid(pids[i], &status, 0);
        FAIL() << mode << " workers timed out";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << mode << " worker " << i << " failed";
  }
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(ExactResumeTest, SaveLoadInFreshProcessesMatchesStraightRunBitwise) {
  const int n = 3;
  const std::string out = TestDir("resume");
  fs::remove_all(out);
  fs::create_directories(out);
  RunWorkers("straight", out, n, 2);
  RunWorkers("first", out, n, 2);
  RunWorkers("second", out, n, 2);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> straight =
        Lines(absl::StrCat(out, "/straight_losses_rank", rank, ".txt"));
    std::vector<std::string> resumed = Lines(absl::StrCat(out, "/first_losses_rank", rank, ".txt"));
    for (const std::string& l : Lines(absl::StrCat(out, "/second_losses_rank", rank, ".txt")))
      resumed.push_back(l);
    ASSERT_EQ(straight.size(), static_cast<size_t>(2 * n));
    EXPECT_EQ(resumed, straight) << "rank " << rank << ": per-step losses (step, hex float) differ";
    auto a = ReadTensorFileUnchecked(absl::StrCat(out, "/straight_final_rank", rank, ".pt"));
    auto b = ReadTensorFileUnchecked(absl::StrCat(out, "/second_final_rank", rank, ".pt"));
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->size(), b->size());
    for (size_t i = 0; i < a->size(); ++i) {
      EXPECT_EQ((*a)[i].first, (*b)[i].first);
      EXPECT_TRUE(at::equal((*a)[i].second, (*b)[i].second))
          << "rank " << rank << " " << (*a)[i].first;
    }
  }
  // Negative control: the same resume without the saved RNG state differs,
  // so dropout is live and the test can fail.
  RunWorkers("second_norng", out, n, 2);
  std::vector<std::string> straight = Lines(out + "/straight_losses_rank0.txt");
  std::vector<std::string> norng = Lines(out + "/second_norng_losses_rank0.txt");
  ASSERT_EQ(norng.size(), static_cast<size_t>(n));
  EXPECT_NE(norng, std::vector<std::string>(straight.begin() + n, straight.end()));
  auto manifest = ReadManifest(TestDir("resume/ckpt/") + CheckpointName(n));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  int rank_states = 0;
  for (const auto& f : manifest->files()) rank_states += f.kind() == "rank_state";
  EXPECT_EQ(rank_states, 2);
  EXPECT_EQ(manifest->trainer().step(), n);
  EXPECT_EQ(manifest->topology().schedule(), "1f1b");
}

// ---------------------------------------------------------------------------
// Reshard (threads; dropout off, so the shared generator does not matter).

struct PrecisionRun;
PrecisionRun TrainRun(const RunSpec& spec, int steps, const std::string& load_from,
                      const std::string& save_root, int steps_after_save = 0);

// Trains `steps` steps at `spec` (or loads `load_from` first), optionally
// saves to `save_root`, then takes one more step; returns its loss.
double TrainSaveStep(const RunSpec& spec, int steps, const std::string& load_from,
                     const std::string& save_root);

// The loss of `step`'s global batch under ToSequential() loaded from `path`.
double SequentialLoss(const std::string& path, int64_t step, int global_microbatches,
                      int num_heads = 2, int64_t vocab = 64) {
  auto specs = MakeGptSpecs(TinyGpt(0.0, num_heads, vocab));
  EXPECT_TRUE(specs.ok());
  auto seq =
      BuildSequential(*specs, /*base_seed=*/12345);  // other seed: weights must come from the file
  EXPECT_TRUE(seq.ok());
  ModelState state = ModelStateOfModule(**seq, static_cast<int64_t>(specs->size()));
  auto report = LoadCheckpoint(path, state, nullptr, CheckpointRank());
  EXPECT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->clean()) << report->Summary();
  auto source = MakeSource(global_microbatches);
  torch::NoGradGuard no_grad;
  (*seq)->eval();
  double sum = 0;
  for (int j = 0; j < global_microbatches; ++j) {
    auto data = (*source)->Get(step, j);
    sum += GptLoss((*seq)->Forward(data->inputs, data->batch), data->batch).item<double>();
  }
  return sum / global_microbatches;
}

TEST(ReshardTrainingTest, SavedAtPipe4LoadsAtPipe2InterleavedPipe1AndSequential) {
  const std::string root = TestDir("reshard_pp4");
  fs::remove_all(root);
  RunSpec pp4;
  pp4.pp = 4;
  const double reference = TrainSaveStep(pp4, 2, "", root);
  const std::string ckpt = root + "/" + CheckpointName(2);
  RunSpec pp2;
  pp2.pp = 2;
  EXPECT_DOUBLE_EQ(TrainSaveStep(pp2, 0, ckpt, ""), reference);
  RunSpec interleaved;
  interleaved.pp = 2;
  interleaved.chunks = 2;
  interleaved.schedule = "interleaved_1f1b";
  EXPECT_NEAR(TrainSaveStep(interleaved, 0, ckpt, ""), reference, 1e-6 * std::abs(reference));
  RunSpec pp1;
  EXPECT_DOUBLE_EQ(TrainSaveStep(pp1, 0, root, ""), reference);
  EXPECT_NEAR(SequentialLoss(ckpt, 2, 4), reference, 1e-6 * std::abs(reference));
}

// Tensor parallelism: a checkpoint saved at one tp loads at another, the
// ranks' slices merged by the split the manifest records and cut again (the
// vocabulary of 62 is padded to 64 at tp 4), and into ToSequential(). Covers
// 2 -> 1, 2 -> 4, 4 -> 2 (with pp 1 -> 2) and 4 -> 1 (padding dropped).
TEST(ReshardTrainingTest, SavedAtOneTensorParallelSizeLoadsAtAnother) {
  const std::string root2 = TestDir("reshard_tp2");
  const std::string root4 = TestDir("reshard_tp4");
  fs::remove_all(root2);
  fs::remove_all(root4);
  RunSpec tp2;
  tp2.pp = 2;
  tp2.tp = 2;
  tp2.num_heads = 4;
  const double reference = TrainSaveStep(tp2, 2, "", root2);
  const std::string ckpt2 = root2 + "/" + CheckpointName(2);
  absl::StatusOr<checkpoint::Manifest> manifest = ReadManifest(ckpt2);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  int shards = 0;
  for (const checkpoint::FileInfo& f : manifest->files()) {
    for (const checkpoint::TensorInfo& t : f.tensors()) shards += t.shard_blocks() > 0;
  }
  EXPECT_GT(shards, 0) << "the manifest records no tensor-parallel shard";

  RunSpec tp1 = tp2;
  tp1.tp = 1;
  EXPECT_NEAR(TrainSaveStep(tp1, 0, ckpt2, ""), reference, 1e-6 * std::abs(reference));
  RunSpec tp4 = tp2;
  tp4.pp = 1;
  tp4.tp = 4;
  EXPECT_NEAR(TrainSaveStep(tp4, 0, ckpt2, ""), reference, 1e-6 * std::abs(reference));
  EXPECT_NEAR(SequentialLoss(ckpt2, 2, 4, 4, kTpVocab), reference, 1e-6 * std::abs(reference));

  // Saved with the padded vocabulary (64 rows at tp 4): 4 -> 2 and 4 -> 1.
  const double reference4 = TrainSaveStep(tp4, 2, "", root4);
  const std::string ckpt4 = root4 + "/" + CheckpointName(2);
  EXPECT_NEAR(TrainSaveStep(tp2, 0, ckpt4, ""), reference4, 1e-6 * std::abs(reference4));
  RunSpec dense = tp1;
  dense.pp = 1;
  EXPECT_NEAR(TrainSaveStep(dense, 0, ckpt4, ""), reference4, 1e-6 * std::abs(reference4));
  // Both trained the same model from the same start.
  EXPECT_NEAR(reference4, reference, 1e-5 * std::abs(reference));
}

// ---------------------------------------------------------------------------
// Precision (threads; dropout off).

struct PrecisionRun {
  std::vector<double> losses;                           // per step, as rank 0 reports them
  std::map<std::string, torch::Tensor> weights;         // global name -> fp32 master / weight
  std::map<std::string, c10::ScalarType> model_dtypes;  // the model's own parameters
};

// Loads `load_from` (unless empty; it must load cleanly, optimizer state
// included), trains `steps` steps, saves to `save_root` (unless empty), trains
// `steps_after_save` more; returns every step's loss and the final weights.
PrecisionRun TrainRun(const RunSpec& spec, int steps, const std::string& load_from,
                      const std::string& save_root, int steps_after_save) {
  const int world = spec.pp * spec.dp * spec.tp;
  auto port = PickFreePort();
  EXPECT_TRUE(port.ok());
  RendezvousOptions ro;
  ro.timeout = std::chrono::seconds(60);
  std::mutex mu;
  PrecisionRun out;
  std::vector<absl::Status> status =
      RunThreadRanks(world, *port, ro, [&](World& w) -> absl::Status {
        at::set_num_threads(1);
        PP_ASSIGN_OR_RETURN(RankRun run, MakeRun(w, spec));
        if (!load_from.empty()) {
          PP_ASSIGN_OR_RETURN(LoadReport report, LoadTrainingCheckpoint(load_from, *run.grid,
                                                                        *run.model, *run.trainer));
          if (!report.clean()) return absl::InternalError(report.Summary());
          if (report.optimizer_states_loaded == 0)
            return absl::InternalError("no optimizer state loaded");
        }
        std::vector<double> losses;
        for (int i = 0; i < steps; ++i) {
          PP_ASSIGN_OR_RETURN(StepResult r, run.trainer->Step());
          losses.push_back(r.loss);
        }
        if (!save_root.empty()) {
          TrainingCheckpointOptions co;
          co.root = save_root;
          PP_RETURN_IF_ERROR(
              SaveTrainingCheckpoint(co, *run.grid, *run.model, *run.trainer).status());
        }
        for (int i = 0; i < steps_after_save; ++i) {
          PP_ASSIGN_OR_RETURN(StepResult r, run.trainer->Step());
          losses.push_back(r.loss);
        }
        // The distributed optimizer's masters, whole (collective: before
        // the lock).
        std::optional<DistributedOptimizer::WholeState> whole;
        if (run.trainer->distributed_optimizer() != nullptr) {
          PP_ASSIGN_OR_RETURN(whole, run.trainer->distributed_optimizer()->GatherWholeState());
        }
        // Vocabulary parallelism: the dense model's names, the tables whole
        // (gathered: collective, before the lock).
        std::map<std::string, torch::Tensor> tables;
        if (run.vocabulary != nullptr) {
          const VocabularyDenseLayout& layout = run.vocabulary->dense_layout();
          PP_ASSIGN_OR_RETURN(tables[layout.embedding_name],
                              run.vocabulary->GatherRows(
                                  run.trainer->MasterOf(run.vocabulary->embedding()), "table"));
          if (!layout.head_name.empty()) {  // an untied head
            PP_ASSIGN_OR_RETURN(
                tables[layout.head_name],
                run.vocabulary->GatherRows(run.trainer->MasterOf(run.vocabulary->head()), "head"));
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        if (w.rank == 0) out.losses = losses;
        for (const auto& item : run.model->named_parameters()) {
          const std::string name = run.vocabulary != nullptr
                                       ? run.vocabulary->dense_layout().DenseName(item.key())
                                       : item.key();
          out.weights[name] =
              (whole ? whole->ValueOf(item.value()) : run.trainer->MasterOf(item.value()))
                  .detach()
                  .clone();
          out.model_dtypes[name] = item.value().scalar_type();
        }
        for (const auto& [name, t] : tables) out.weights[name] = t.clone();
        return absl::OkStatus();
      });
  for (int r = 0; r < world; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  return out;
}

double TrainSaveStep(const RunSpec& spec, int steps, const std::string& load_from,
                     const std::string& save_root) {
  const PrecisionRun run = TrainRun(spec, steps, load_from, save_root, 1);
  return run.losses.empty() ? -1 : run.losses.back();
}

std::string FirstDifference(const std::map<std::string, torch::Tensor>& a,
                            const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) return absl::StrCat(a.size(), " vs ", b.size(), " tensors");
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end()) return "missing " + name;
    if (t.scalar_type() != it->second.scalar_type() || !torch::equal(t, it->second)) return name;
  }
  return "";
}

// bf16 (fp32 masters, fp32 AdamW state in the checkpoint): a run saved after
// 2 steps and resumed for 2 more equals the straight 4-step run bit for bit
// (losses and masters); the model itself trains in bf16 and the checkpoint
// holds fp32.
TEST(PrecisionCheckpointTest, Bf16ResumesBitwise) {
  const std::string root = TestDir("bf16_resume");
  fs::remove_all(root);
  RunSpec bf16;
  bf16.pp = 2;
  bf16.precision = Precision::kBf16;
  const PrecisionRun straight = TrainRun(bf16, 4, "", "");
  ASSERT_EQ(straight.losses.size(), 4u);
  for (const auto& [name, dtype] : straight.model_dtypes) {
    EXPECT_EQ(dtype, torch::kBFloat16) << name;
    EXPECT_EQ(straight.weights.at(name).scalar_type(), torch::kFloat) << name;
  }
  const PrecisionRun first = TrainRun(bf16, 2, "", root);
  const PrecisionRun second = TrainRun(bf16, 2, root + "/" + CheckpointName(2), "");
  EXPECT_EQ(first.losses,
            std::vector<double>(straight.losses.begin(), straight.losses.begin() + 2));
  EXPECT_EQ(second.losses, std::vector<double>(straight.losses.begin() + 2, straight.losses.end()));
  EXPECT_EQ(FirstDifference(straight.weights, second.weights), "");
  // What was written is fp32.
  auto files = ReadManifest(root + "/" + CheckpointName(2));
  ASSERT_TRUE(files.ok()) << files.status();
  int fp32_files = 0;
  for (const auto& f : files->files()) {
    if (f.kind() != "model") continue;
    auto tensors = ReadTensorFileUnchecked(root + "/" + CheckpointName(2) + "/" + f.path());
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    for (const auto& [name, t] : *tensors) {
      EXPECT_EQ(t.scalar_type(), torch::kFloat) << f.path() << " " << name;
      ++fp32_files;
    }
  }
  EXPECT_GT(fp32_files, 0);
}

// A bf16 checkpoint loads into an fp32 run (whose weights are then the bf16
// run's masters exactly) and an fp32 checkpoint into a bf16 run (whose
// masters are then the fp32 weights exactly); each continues training.
TEST(PrecisionCheckpointTest, CheckpointsCrossPrecisions) {
  const std::string root = TestDir("bf16_cross");
  fs::remove_all(root);
  RunSpec bf16;
  bf16.pp = 2;
  bf16.precision = Precision::kBf16;
  RunSpec fp32 = bf16;
  fp32.precision = Precision::kFp32;
  const PrecisionRun saved_bf16 = TrainRun(bf16, 2, "", root + "/from_bf16");
  const PrecisionRun loaded_fp32 =
      TrainRun(fp32, 0, root + "/from_bf16/" + CheckpointName(2), root + "/from_fp32");
  EXPECT_EQ(FirstDifference(saved_bf16.weights, loaded_fp32.weights), "");
  for (const auto& [name, dtype] : loaded_fp32.model_dtypes) EXPECT_EQ(dtype, torch::kFloat);
  const PrecisionRun back_bf16 = TrainRun(bf16, 0, root + "/from_fp32/" + CheckpointName(2), "");
  EXPECT_EQ(FirstDifference(loaded_fp32.weights, back_bf16.weights), "");
  // Both continue from there: the next step's losses agree to bf16's precision.
  const PrecisionRun next_fp32 = TrainRun(fp32, 1, root + "/from_bf16/" + CheckpointName(2), "");
  const PrecisionRun next_bf16 = TrainRun(bf16, 1, root + "/from_fp32/" + CheckpointName(2), "");
  ASSERT_EQ(next_fp32.losses.size(), 1u);
  ASSERT_EQ(next_bf16.losses.size(), 1u);
  EXPECT_NEAR(next_bf16.losses[0], next_fp32.losses[0], 0.02 * std::abs(next_fp32.losses[0]));
}

// Layer-wise files by global layer index: a checkpoint written under V
// placement (zbv: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2) loads
// under the looped placement (interleaved_1f1b: rank 0 holds 0 and 2) and
// back, and into ToSequential(); the next step's loss is the same.
TEST(ReshardTrainingTest, VPlacementCheckpointLoadsUnderLoopedAndBack) {
  RunSpec v;
  v.pp = 2;
  v.chunks = 2;
  v.schedule = "zbv";
  RunSpec looped = v;
  looped.schedule = "interleaved_1f1b";
  ASSERT_NE(MakeSchedule("zbv", {2, 4, 2, 0})->stage_to_rank,
            MakeSchedule("interleaved_1f1b", {2, 4, 2, 0})->stage_to_rank);

  const std::string v_root = TestDir("reshard_zbv");
  fs::remove_all(v_root);
  const double v_reference = TrainSaveStep(v, 2, "", v_root);
  const std::string v_ckpt = v_root + "/" + CheckpointName(2);
  EXPECT_NEAR(TrainSaveStep(looped, 0, v_ckpt, ""), v_reference, 1e-6 * std::abs(v_reference));
  EXPECT_NEAR(SequentialLoss(v_ckpt, 2, 4), v_reference, 1e-6 * std::abs(v_reference));

  const std::string looped_root = TestDir("reshard_looped");
  fs::remove_all(looped_root);
  const double looped_reference = TrainSaveStep(looped, 2, "", looped_root);
  EXPECT_NEAR(TrainSaveStep(v, 0, looped_root + "/" + CheckpointName(2), ""), looped_reference,
              1e-6 * std::abs(looped_reference));
  // Both placements trained the same model from the same start.
  EXPECT_NEAR(looped_reference, v_reference, 1e-5 * std::abs(v_reference));
}

TEST(ReshardTrainingTest, SavedAtPipe2Data2LoadsAtPipe4Data1) {
  const std::string root = TestDir("reshard_pp2dp2");
  fs::remove_all(root);
  RunSpec from;
  from.pp = 2;
  from.dp = 2;
  from.global_microbatches = 4;
  const double reference = TrainSaveStep(from, 2, "", root);
  RunSpec to;
  to.pp = 4;
  to.global_microbatches = 4;
  EXPECT_NEAR(TrainSaveStep(to, 0, root, ""), reference, 1e-6 * std::abs(reference));
}

// 4 steps straight against 2 steps, a save under `name` and 2 more after a
// load, at `spec`: the losses and the final weights bit for bit. Returns the
// weights after the save and after the resume.
std::pair<PrecisionRun, PrecisionRun> ExpectResumesBitwise(const RunSpec& spec,
                                                           const std::string& name) {
  const std::string root = TestDir(name);
  fs::remove_all(root);
  const PrecisionRun straight = TrainRun(spec, 4, "", "");
  PrecisionRun first = TrainRun(spec, 2, "", root);
  PrecisionRun second = TrainRun(spec, 2, root + "/" + CheckpointName(2), "");
  EXPECT_EQ(straight.losses.size(), 4u);
  if (straight.losses.size() != 4u) return {first, second};
  EXPECT_EQ(first.losses,
            std::vector<double>(straight.losses.begin(), straight.losses.begin() + 2));
  EXPECT_EQ(second.losses, std::vector<double>(straight.losses.begin() + 2, straight.losses.end()));
  EXPECT_EQ(FirstDifference(straight.weights, second.weights), "");
  return {std::move(first), std::move(second)};
}

// The distributed optimizer's checkpoints hold the unsharded state (gathered
// from the slices): the same layout resumes bit for bit, fp32 and bf16.
TEST(DistributedOptimizerCheckpointTest, ResumesBitwise) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(PrecisionName(precision));
    RunSpec spec;
    spec.pp = 2;
    spec.dp = 2;
    spec.precision = precision;
    spec.distributed_optimizer = true;
    ExpectResumesBitwise(spec, absl::StrCat("zero1_resume_", PrecisionName(precision)));
  }
}

// Saved at dp 4 with the distributed optimizer, loaded at dp 2 without it,
// saved, loaded at dp 1 with it: the losses continue an uninterrupted dp 4
// run's (the data-parallel sums round differently at each dp, so within
// 1e-5 relative, not bitwise).
TEST(DistributedOptimizerCheckpointTest, ReshardsAcrossDataParallelAndOnOff) {
  const std::string root = TestDir("zero1_reshard");
  fs::remove_all(root);
  RunSpec dp4_on;
  dp4_on.pp = 2;
  dp4_on.dp = 4;
  dp4_on.distributed_optimizer = true;
  RunSpec dp2_off = dp4_on;
  dp2_off.dp = 2;
  dp2_off.distributed_optimizer = false;
  RunSpec dp1_on = dp4_on;
  dp1_on.dp = 1;
  const PrecisionRun straight = TrainRun(dp4_on, 6, "", "");
  const PrecisionRun a = TrainRun(dp4_on, 2, "", root + "/a");
  const PrecisionRun b = TrainRun(dp2_off, 2, root + "/a/" + CheckpointName(2), root + "/b");
  const PrecisionRun c = TrainRun(dp1_on, 2, root + "/b/" + CheckpointName(4), "");
  std::vector<double> resumed = a.losses;
  resumed.insert(resumed.end(), b.losses.begin(), b.losses.end());
  resumed.insert(resumed.end(), c.losses.begin(), c.losses.end());
  ASSERT_EQ(resumed.size(), straight.losses.size());
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_NEAR(resumed[i], straight.losses[i], 1e-5 * std::abs(straight.losses[i]))
        << "step " << i;
  }
  for (const auto& [name, t] : straight.weights) {
    EXPECT_TRUE(torch::allclose(c.weights.at(name), t, 1e-4, 1e-6)) << name;
  }
}

// Vocabulary parallelism's checkpoints hold the tables whole with their
// optimizer state: the same layout resumes bit for bit (fp32 and bf16; the
// RNG and every moment come back).
TEST(VocabularyCheckpointTest, ResumesBitwise) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(PrecisionName(precision));
    RunSpec spec;
    spec.pp = 2;
    spec.precision = precision;
    spec.vocab_parallel = true;
    const auto [first, second] =
        ExpectResumesBitwise(spec, absl::StrCat("vocab_resume_", PrecisionName(precision)));
    // The table trained after the resume: its whole value moved.
    ASSERT_EQ(first.weights.count("tied.embed.tok_embed.weight"), 1u);
    EXPECT_FALSE(torch::equal(first.weights.at("tied.embed.tok_embed.weight"),
                              second.weights.at("tied.embed.tok_embed.weight")));
  }
}

// With the distributed optimizer too (the shards' slices and state gathered
// over the data group, then the rows over the pipe): the same layout resumes
// bit for bit, and the checkpoint loads exactly into a run with neither.
TEST(VocabularyCheckpointTest, WithTheDistributedOptimizer) {
  RunSpec spec;
  spec.pp = 2;
  spec.dp = 2;
  spec.vocab_parallel = true;
  spec.distributed_optimizer = true;
  const auto [first, second] = ExpectResumesBitwise(spec, "vocab_zero1_resume");
  RunSpec plain = spec;
  plain.vocab_parallel = false;
  plain.distributed_optimizer = false;
  const PrecisionRun loaded =
      TrainRun(plain, 0, TestDir("vocab_zero1_resume") + "/" + CheckpointName(2), "", 0);
  const PrecisionRun reloaded =
      TrainRun(spec, 0, TestDir("vocab_zero1_resume") + "/" + CheckpointName(2), "", 0);
  EXPECT_EQ(FirstDifference(reloaded.weights, loaded.weights), "");
}

// A vocabulary-parallel checkpoint is the dense model's: saved at pp 2, it
// loads into a pp 2 run without vocabulary parallelism (its weights exactly
// the saved ones, the table included), into a pp 4 run with it (the rows
// cut four ways) and into ToSequential(); each next step's loss is the
// saved run's. And a dense run's checkpoint loads into a vocabulary-parallel
// run, exactly.
TEST(VocabularyCheckpointTest, IsTheDenseModelsCheckpoint) {
  const std::string root = TestDir("vocab_reshard");
  fs::remove_all(root);
  RunSpec vocab2;
  vocab2.pp = 2;
  vocab2.vocab_parallel = true;
  RunSpec dense2 = vocab2;
  dense2.vocab_parallel = false;
  RunSpec vocab4 = vocab2;
  vocab4.pp = 4;
  const PrecisionRun saved = TrainRun(vocab2, 2, "", root + "/vocab", 1);
  ASSERT_EQ(saved.losses.size(), 3u);
  const double reference = saved.losses.back();
  const std::string ckpt = root + "/vocab/" + CheckpointName(2);
  const PrecisionRun dense = TrainRun(dense2, 0, ckpt, root + "/dense", 1);
  ASSERT_EQ(dense.losses.size(), 1u);
  // The sharded head rounds its logits' sums differently from the dense one.
  EXPECT_NEAR(dense.losses[0], reference, 1e-5 * std::abs(reference));
  const PrecisionRun resharded = TrainRun(vocab4, 0, ckpt, "", 1);
  ASSERT_EQ(resharded.losses.size(), 1u);
  EXPECT_NEAR(resharded.losses[0], reference, 1e-5 * std::abs(reference));
  EXPECT_NEAR(SequentialLoss(ckpt, 2, 4), reference, 1e-5 * std::abs(reference));
  // Loading is exact both ways: what a load gives is what was saved.
  const PrecisionRun dense_loaded = TrainRun(dense2, 0, ckpt, "", 0);
  const PrecisionRun vocab_saved_at_2 = TrainRun(vocab2, 0, ckpt, "", 0);
  EXPECT_EQ(FirstDifference(vocab_saved_at_2.weights, dense_loaded.weights), "");
  const std::string dense_ckpt = root + "/dense/" + CheckpointName(2);
  const PrecisionRun vocab_from_dense = TrainRun(vocab4, 0, dense_ckpt, "", 0);
  EXPECT_EQ(FirstDifference(dense_loaded.weights, vocab_from_dense.weights), "");
}

TEST(TrainingCheckpointerTest, PeriodicSavesPruningAndAutoResume) {
  EXPECT_EQ(TrainingCheckpointer::Create({.save_interval = 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainingCheckpointer::Create({.dir = "/x", .save_interval = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string root = TestDir("checkpointer");
  fs::remove_all(root);
  auto run_statuses = [&](const CheckpointPolicy& policy, int64_t last_step,
                          int64_t* resumed_at) -> std::vector<absl::Status> {
    auto port = PickFreePort();
    if (!port.ok()) return {port.status()};
    RendezvousOptions ro;
    ro.timeout = std::chrono::seconds(60);
    auto status = RunThreadRanks(2, *port, ro, [&](World& w) -> absl::Status {
      RunSpec spec;
      spec.pp = 2;
      PP_ASSIGN_OR_RETURN(RankRun run, MakeRun(w, spec));
      PP_ASSIGN_OR_RETURN(TrainingCheckpointer ckpt, TrainingCheckpointer::Create(policy));
      PP_RETURN_IF_ERROR(ckpt.MaybeResume(*run.grid, *run.model, *run.trainer).status());
      if (w.rank == 0) *resumed_at = run.trainer->step();
      while (run.trainer->step() < last_step) {
        PP_RETURN_IF_ERROR(run.trainer->Step().status());
        PP_RETURN_IF_ERROR(ckpt.AfterStep(*run.grid, *run.model, *run.trainer, last_step).status());
      }
      return absl::OkStatus();
    });
    return status;
  };
  auto run_loop = [&](const CheckpointPolicy& policy, int64_t last_step, int64_t* resumed_at) {
    for (const auto& s : run_statuses(policy, last_step, resumed_at)) EXPECT_TRUE(s.ok()) << s;
  };
  int64_t resumed_at = -1;
  CheckpointPolicy policy{.dir = root, .save_interval = 2, .keep_last = 2, .resume = "auto"};
  run_loop(policy, 5, &resumed_at);  // fresh start (nothing to resume); saves at 2 and 4
  EXPECT_EQ(resumed_at, 0);
  policy.save_final = true;
  run_loop(policy, 7, &resumed_at);  // resumes at 4, saves at 6 and 7, keeps 2
  EXPECT_EQ(resumed_at, 4);
  auto names = ListCheckpoints(root);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{CheckpointName(6), CheckpointName(7)}));
  policy.resume = root + "/" + CheckpointName(6);
  run_loop(policy, 6, &resumed_at);
  EXPECT_EQ(resumed_at, 6);

  // Issue 29: one run at a time per checkpoint dir. While another live holder
  // has the dir's lock, every rank of a run that would save there stops,
  // naming the holder.
  policy.resume = "auto";
  policy.owner = "runs/a";
  {
    auto other = CheckpointDirLock::Acquire(root, ThisProcessAsHolder("run-b", "runs/b"));
    ASSERT_TRUE(other.ok()) << other.status();
    std::vector<absl::Status> refused = run_statuses(policy, 9, &resumed_at);
    ASSERT_EQ(refused.size(), 2u);
    EXPECT_EQ(refused[0].code(), absl::StatusCode::kFailedPrecondition) << refused[0];
    EXPECT_NE(std::string(refused[0].message()).find("is in use by run 'run-b'"), std::string::npos)
        << refused[0];
    EXPECT_FALSE(refused[1].ok());
  }
  run_loop(policy, 9, &resumed_at);  // owner runs/a saves step 8 and 9
  EXPECT_EQ(resumed_at, 7);
  // A resume refuses another run's checkpoint unless told otherwise.
  policy.owner = "runs/b";
  std::vector<absl::Status> other_run = run_statuses(policy, 10, &resumed_at);
  ASSERT_EQ(other_run.size(), 2u);
  EXPECT_EQ(other_run[0].code(), absl::StatusCode::kFailedPrecondition) << other_run[0];
  EXPECT_NE(std::string(other_run[0].message())
                .find("was written by run 'runs/a', not by this run ('runs/b')"),
            std::string::npos)
      << other_run[0];
  policy.resume_other_runs = true;
  run_loop(policy, 10, &resumed_at);
  EXPECT_EQ(resumed_at, 9);
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  if (std::getenv("PP_CKPT_WORKER") != nullptr) {
    absl::Status s = pp::WorkerMain();
    if (!s.ok()) {
      std::fprintf(stderr, "worker failed: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
