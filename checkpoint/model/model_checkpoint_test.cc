#include "checkpoint/model/model_checkpoint.h"
#include "checkpoint/model/test_files.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include <google/protobuf/text_format.h>
#include <torch/torch.h>

#include "common/torch_compat.h"
#include "gtest/gtest.h"
#include "topology/device.h"
#include "topology/rendezvous.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

namespace fs = std::filesystem;
using checkpoint::test_files::FreshDir;

constexpr int kLayers = 6;

// Global layers [first, end) of a 6-layer toy model, named like StageModule
// ("layers.<i>.*", "tied.emb.*"); layer 3 is a BatchNorm (buffers, a Long
// one among them). `seed` changes every weight, so a loaded model provably
// got its values from the checkpoint.
class ToyStage : public torch::nn::Module {
 public:
  ToyStage(int first, int end, bool with_tie, int seed = 0, int width = 8) {
    auto layers = register_module("layers", std::make_shared<torch::nn::Module>());
    for (int i = first; i < end; ++i) {
      torch::manual_seed(100 + i + seed);
      if (i == 3) {
        auto bn = layers->register_module(std::to_string(i), torch::nn::BatchNorm1d(width));
        bn->running_mean.uniform_();
        bn->num_batches_tracked.fill_(5 + seed);
      } else {
        layers->register_module(std::to_string(i), torch::nn::Linear(width, width));
      }
    }
    if (with_tie) {
      auto tied = register_module("tied", std::make_shared<torch::nn::Module>());
      torch::manual_seed(7 + seed);
      tied->register_module("emb",
                            torch::nn::Linear(torch::nn::LinearOptions(width, width).bias(false)));
    }
  }
};

// Deterministic gradients that depend only on a parameter's value.
void SetGrads(torch::nn::Module& m) {
  for (auto& p : m.parameters()) p.mutable_grad() = (p.detach() * 0.3 + 0.01).sin();
}

void ExpectSameTensors(const ModelState& got, const ModelState& want) {
  std::map<std::string, at::Tensor> want_by_name(want.tensors.begin(), want.tensors.end());
  for (const auto& [name, t] : got.tensors) {
    auto it = want_by_name.find(name);
    ASSERT_NE(it, want_by_name.end()) << name;
    EXPECT_TRUE(at::equal(t, it->second)) << name;
  }
}

// The tensors of `full` that belong to layers [first, end) (and the tie).
ModelState Slice(const ModelState& full, int first, int end, bool with_tie) {
  ModelState out;
  out.num_layers = full.num_layers;
  out.tie_writer_stage = full.tie_writer_stage;
  for (const auto& [name, t] : full.tensors) {
    auto loc = LocateTensor(name);
    EXPECT_TRUE(loc.ok());
    if (loc->tie_key.empty() ? (loc->layer >= first && loc->layer < end) : with_tie)
      out.tensors.emplace_back(name, t);
  }
  return out;
}

TEST(ModelCheckpointNamesTest, LocatesGlobalNamesAndNamesFiles) {
  auto a = LocateTensor("layers.7.fc1.weight");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->layer, 7);
  EXPECT_EQ(a->local, "fc1.weight");
  auto b = LocateTensor("tied.wte.weight");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->tie_key, "wte");
  EXPECT_EQ(b->local, "weight");
  for (const char* bad :
       {"fc.weight", "layers.x.weight", "layers.3", "tied.wte", "layers.-1.w", "tied..w"}) {
    auto r = LocateTensor(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos);
  }
  EXPECT_EQ(LayerFileName(7, 0, 1, "model"), "layer_07-model_states.pt");
  EXPECT_EQ(LayerFileName(123, 1, 2, "optim"), "layer_123-model_01-optim_states.pt");
  EXPECT_EQ(TiedFileName("wte", 0, 1, "model"), "tied_wte-model_states.pt");
  EXPECT_EQ(RankStateFileName(1, 0, 0), "rank_state-pipe_01-data_00-model_00.pt");
}

// A reference model trained two AdamW steps, saved by 4 thread ranks at
// pipe=2 x data=2, then loaded at pipe 4, 1 and as one module.
class ReshardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    root_ = FreshDir("reshard");
    full_ = std::make_shared<ToyStage>(0, kLayers, true);
    full_state_ = ModelStateOfModule(*full_, kLayers);
    full_state_.tie_writer_stage["emb"] = 0;
    optimizer_ = std::make_unique<torch::optim::AdamW>(
        full_->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    // The reference for the step after loading: an identical model trained
    // three steps without any checkpoint.
    ref_after_ = std::make_shared<ToyStage>(0, kLayers, true);
    torch::optim::AdamW ref_opt(ref_after_->parameters(),
                                torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    for (int step = 0; step < 3; ++step) {
      if (step < 2) {
        SetGrads(*full_);
        optimizer_->step();
      }
      SetGrads(*ref_after_);
      ref_opt.step();
    }
  }

  // Saves at pipe=2 x data=2 from 4 thread ranks; stage 0 holds layers 0-2
  // and the tie, stage 1 layers 3-5 and the tie.
  // `slices`: as a distributed optimizer saves, each data-parallel rank
  // writes its own part of the optimizer state (SaveRequest::
  // optimizer_slices): data rank 0 the first half of every parameter's
  // flattened elements (rounded up), rank 1 the rest.
  std::vector<absl::Status> SaveFromThreads(int64_t step, int failing_rank = -1,
                                            bool slices = false) {
    auto port = PickFreePort();
    EXPECT_TRUE(port.ok());
    RendezvousOptions options;
    options.timeout = std::chrono::seconds(20);
    return RunThreadRanks(4, *port, options, [&](World& world) -> absl::Status {
      CheckpointRank rank;
      rank.rank = world.rank;
      rank.world_size = 4;
      rank.stage = world.rank / 2;
      rank.num_stages = 2;
      rank.data_rank = world.rank % 2;
      rank.data_size = 2;
      rank.world = world.group;
      rank.timeout = std::chrono::seconds(20);
      ModelState mine = Slice(full_state_, rank.stage * 3, rank.stage * 3 + 3, true);
      if (world.rank == failing_rank) mine.tensors.emplace_back("not_global.weight", at::ones(1));
      SaveRequest request;
      request.root = root_;
      request.step = step;
      request.model = &mine;
      request.optimizer = optimizer_.get();
      std::vector<at::Tensor> parts;
      std::vector<std::pair<at::Tensor, at::Tensor>> part_of;  // (part, whole param)
      if (slices) {
        request.optimizer = nullptr;
        for (const auto& [name, param] : mine.tensors) {
          const int64_t n = param.numel(), half = (n + 1) / 2;
          const int64_t offset = rank.data_rank == 0 ? 0 : half;
          const int64_t len = rank.data_rank == 0 ? half : n - half;
          if (len == 0) continue;
          at::Tensor part = param.detach().reshape({-1}).narrow(0, offset, len).clone();
          request.optimizer_slices[name] = {offset, part};
          parts.push_back(part);
          part_of.push_back({part, param});
        }
      }
      torch::optim::AdamW slices_optimizer(parts, torch::optim::AdamWOptions(1e-2));
      for (const auto& [part, param] : part_of) {
        auto found = optimizer_->state().find(torch_compat::OptimizerStateKeyOf(param));
        if (found == optimizer_->state().end()) continue;  // a buffer
        const auto& whole = static_cast<const torch::optim::AdamWParamState&>(*found->second);
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        const int64_t from = rank.data_rank == 0 ? 0 : (param.numel() + 1) / 2;
        state->step(whole.step())
            .exp_avg(whole.exp_avg().reshape({-1}).narrow(0, from, part.numel()).clone())
            .exp_avg_sq(whole.exp_avg_sq().reshape({-1}).narrow(0, from, part.numel()).clone());
        slices_optimizer.state()[torch_compat::OptimizerStateKeyOf(part)] = std::move(state);
      }
      if (slices) request.slices_optimizer = &slices_optimizer;
      request.trainer.set_lr_step(step);
      request.trainer.set_data_position(step * 16);
      request.rank_state = {{"cpu_rng", at::full({4}, world.rank, at::kByte)}};
      request.config = "model: \"toy\"";
      return SaveCheckpoint(request, rank).status();
    });
  }

  // Loads into layers [first, end) (+ tie) with a fresh AdamW, and checks the
  // tensors and the next AdamW step against the reference.
  void LoadAndCheck(int first, int end, bool with_tie, const CheckpointRank& rank) {
    SCOPED_TRACE(testing::Message() << "layers [" << first << ", " << end << ")");
    ToyStage piece(first, end, with_tie, /*seed=*/1000);
    ModelState state = ModelStateOfModule(piece, kLayers);
    torch::optim::AdamW optimizer(piece.parameters(),
                                  torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    auto report = LoadCheckpoint(root_, state, &optimizer, rank);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->clean()) << report->Summary();
    EXPECT_EQ(report->tensors_loaded, static_cast<int64_t>(state.tensors.size()));
    EXPECT_EQ(report->optimizer_states_loaded, static_cast<int64_t>(piece.parameters().size()));
    ExpectSameTensors(state, full_state_);
    // One more step on both: bitwise equal parameters.
    SetGrads(piece);
    optimizer.step();
    ExpectSameTensors(state, ModelStateOfModule(*ref_after_, kLayers));
  }

  // LoadAndCheck at pipe=4 (stages [0,2) [2,3) [3,5) [5,6), the tie on the
  // first and last) and at pipe=1 (or ToSequential()).
  void LoadAtPipe4AndPipe1() {
    const int bounds[] = {0, 2, 3, 5, 6};
    for (int s = 0; s < 4; ++s) {
      CheckpointRank rank;
      rank.stage = s;
      rank.num_stages = 4;
      rank.rank = s;
      LoadAndCheck(bounds[s], bounds[s + 1], s == 0 || s == 3, rank);
    }
    LoadAndCheck(0, kLayers, true, CheckpointRank());
  }

  std::string root_;
  std::shared_ptr<ToyStage> full_;
  ModelState full_state_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::shared_ptr<ToyStage> ref_after_;
};

TEST_F(ReshardTest, SavedAtPipe2Data2LoadsAtPipe4Pipe1AndSequential) {
  auto status = SaveFromThreads(10);
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  auto manifest = ReadManifest((fs::path(root_) / CheckpointName(10)).string());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->topology().pipe(), 2);
  EXPECT_EQ(manifest->topology().data(), 2);
  EXPECT_EQ(manifest->trainer().data_position(), 160);
  // One model + one optim file per layer and for the tie, four rank states;
  // the writes of each stage are spread over both data-parallel ranks.
  std::set<std::string> paths;
  std::set<int> writers;
  for (const auto& f : manifest->files()) {
    paths.insert(f.path());
    writers.insert(f.writer_rank());
  }
  EXPECT_EQ(paths.size(), static_cast<size_t>(2 * kLayers + 2 + 4));
  EXPECT_TRUE(paths.count("layer_03-model_states.pt"));
  EXPECT_TRUE(paths.count("tied_emb-optim_states.pt"));
  EXPECT_EQ(writers, (std::set<int>{0, 1, 2, 3}));
  for (const auto& f : manifest->files()) {
    if (f.tie_key() == "emb") {
      EXPECT_LT(f.writer_rank(), 2) << "the tie is written by stage 0";
    }
  }

  LoadAtPipe4AndPipe1();
}

// A distributed optimizer's checkpoint: each data rank's parts of the state
// in files of its own ("layer_03-data_01-optim_states.pt", entries recorded as
// slices), the weights whole. Loads put the parts together at pipe 4 and 1
// as if the state had been saved whole; a missing part is named.
TEST_F(ReshardTest, OptimizerPartsPerDataRankLoadAnywhere) {
  auto status = SaveFromThreads(10, /*failing_rank=*/-1, /*slices=*/true);
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(status[r].ok());
  const std::string dir = (fs::path(root_) / CheckpointName(10)).string();
  auto manifest = ReadManifest(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  std::set<std::string> paths;
  int sliced = 0;
  for (const auto& f : manifest->files()) {
    paths.insert(f.path());
    for (const auto& t : f.tensors()) sliced += t.sliced();
  }
  EXPECT_TRUE(paths.count("layer_03-model_states.pt"));
  EXPECT_FALSE(paths.count("layer_03-optim_states.pt"));
  EXPECT_TRUE(paths.count("layer_03-data_00-optim_states.pt"));
  EXPECT_TRUE(paths.count("layer_03-data_01-optim_states.pt"));
  EXPECT_TRUE(paths.count("tied_emb-data_01-optim_states.pt"));
  EXPECT_GT(sliced, 0);

  LoadAtPipe4AndPipe1();

  // A manifest without data rank 1's part of layer 3 (as if it were lost):
  // the state put together is incomplete, and the load says which.
  checkpoint::Manifest without = *manifest;
  without.clear_files();
  for (const auto& f : manifest->files()) {
    if (f.path() != "layer_03-data_01-optim_states.pt") *without.add_files() = f;
  }
  std::string text;
  ASSERT_TRUE(google::protobuf::TextFormat::PrintToString(without, &text));
  std::ofstream(fs::path(dir) / kManifestFileName) << text;  // no checksum line: read as is
  ToyStage piece(0, kLayers, true, /*seed=*/1000);
  ModelState state = ModelStateOfModule(piece, kLayers);
  torch::optim::AdamW optimizer(piece.parameters(), torch::optim::AdamWOptions(1e-2));
  auto report = LoadCheckpoint(root_, state, &optimizer, CheckpointRank());
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDataLoss) << report.status();
  EXPECT_NE(report.status().message().find("the data-parallel parts of"), std::string::npos)
      << report.status();
  EXPECT_NE(report.status().message().find("layer_03-data_00-optim_states.pt"), std::string::npos)
      << report.status();
}

TEST_F(ReshardTest, RankStateComesBackOnlyUnderTheSameLayout) {
  ASSERT_TRUE(SaveFromThreads(3)[0].ok());
  ModelState state = ModelStateOfModule(*full_, kLayers);
  CheckpointRank same;
  same.rank = 3;
  same.world_size = 4;
  same.stage = 1;
  same.num_stages = 2;
  same.data_rank = 1;
  same.data_size = 2;
  auto report = LoadCheckpoint(root_, state, nullptr, same, {.strict = false});
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_TRUE(report->rank_state_found);
  ASSERT_EQ(report->rank_state.size(), 1u);
  EXPECT_TRUE(at::equal(report->rank_state[0].second, at::full({4}, 3, at::kByte)));
  auto other = LoadCheckpoint(root_, state, nullptr, CheckpointRank(), {.strict = false});
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->rank_state_found);
}

TEST_F(ReshardTest, AFailingRankCommitsNothing) {
  ASSERT_TRUE(SaveFromThreads(1)[0].ok());
  auto status = SaveFromThreads(2, /*failing_rank=*/3);
  for (int r = 0; r < 4; ++r) EXPECT_FALSE(status[r].ok()) << "rank " << r;
  EXPECT_NE(status[3].message().find("not_global.weight"), std::string::npos) << status[3];
  EXPECT_NE(status[0].message().find("rank 3"), std::string::npos) << status[0];
  auto dir = ResolveCheckpointDir(root_);
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(fs::path(*dir).filename(), CheckpointName(1));
  EXPECT_FALSE(fs::exists(fs::path(root_) / CheckpointName(2)));
  for (const auto& entry : fs::directory_iterator(root_)) {
    EXPECT_NE(entry.path().filename().string().rfind(".tmp-", 0), 0u) << entry.path();
  }
}

// Issue 29: the disk fills during a save. A child process whose files may
// not grow past 64 KiB (RLIMIT_FSIZE: EFBIG, the same path as ENOSPC; no
// root, no tmpfs) saves step 2 over a good step 1: the save returns an error
// naming the file (the child exits 1, it does not abort), and `latest` still
// names step 1, which loads.
TEST(SaveRequestTest, AFullDiskFailsTheSaveCleanlyAndLatestStays) {
  const std::string root = FreshDir("full_disk");
  ToyStage stage(0, kLayers, true);
  ModelState state = ModelStateOfModule(stage, kLayers);
  SaveRequest request;
  request.root = root;
  request.step = 1;
  request.model = &state;
  ASSERT_TRUE(SaveCheckpoint(request, CheckpointRank()).ok());
  // Big enough that its file crosses the limit.
  request.rank_state = {{"big", torch::zeros({1 << 16})}};
  request.step = 2;
  const std::string message_file = root + "/../full_disk_message";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of killing
    rlimit limit{64 << 10, 64 << 10};
    setrlimit(RLIMIT_FSIZE, &limit);
    absl::StatusOr<std::string> saved = SaveCheckpoint(request, CheckpointRank());
    // Lifted again to report (the message file is small anyway).
    rlimit unlimited{RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_FSIZE, &unlimited);
    std::ofstream(message_file) << saved.status().ToString();
    _exit(saved.ok() ? 0 : 1);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus)) << "the save killed its process (signal "
                                  << (WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0) << ")";
  EXPECT_EQ(WEXITSTATUS(wstatus), 1);
  std::ifstream in(message_file);
  std::string message((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(message.find("RESOURCE_EXHAUSTED"), std::string::npos) << message;
  EXPECT_NE(message.find("cannot write checkpoint file " + root), std::string::npos) << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
  auto dir = ResolveCheckpointDir(root);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(fs::path(*dir).filename(), CheckpointName(1));
  EXPECT_TRUE(VerifyCheckpointFiles(*dir).ok());
  EXPECT_FALSE(fs::exists(fs::path(root) / CheckpointName(2)));
  // Issue #42 class 7: the failed save's temporary folder held the space
  // every retry needs; it is gone.
  for (const auto& entry : fs::directory_iterator(root)) {
    EXPECT_NE(entry.path().filename().string().rfind(".tmp-", 0), 0u) << entry.path();
  }
}

TEST(OptimizerStateTest, SgdMomentumRoundTripsAndContinuesBitwise) {
  const std::string root = FreshDir("sgd");
  auto options = torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01);
  ToyStage a(0, kLayers, true), reference(0, kLayers, true);
  torch::optim::SGD opt_a(a.parameters(), options), opt_ref(reference.parameters(), options);
  for (int step = 0; step < 3; ++step) {
    if (step < 2) {
      SetGrads(a);
      opt_a.step();
    }
    SetGrads(reference);
    opt_ref.step();
  }
  ModelState state = ModelStateOfModule(a, kLayers);
  SaveRequest request;
  request.root = root;
  request.step = 2;
  request.model = &state;
  request.optimizer = &opt_a;
  ASSERT_TRUE(SaveCheckpoint(request, CheckpointRank()).ok());
  auto manifest = ReadManifest((fs::path(root) / CheckpointName(2)).string());
  ASSERT_TRUE(manifest.ok());
  bool has_momentum = false;
  for (const auto& f : manifest->files()) {
    for (const auto& t : f.tensors())
      has_momentum = has_momentum || t.name() == "weight.momentum_buffer";
  }
  EXPECT_TRUE(has_momentum);

  ToyStage b(0, kLayers, true, /*seed=*/5);
  ModelState loaded = ModelStateOfModule(b, kLayers);
  torch::optim::SGD opt_b(b.parameters(), options);
  auto report = LoadCheckpoint(root, loaded, &opt_b, CheckpointRank());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->clean()) << report->Summary();
  SetGrads(b);
  opt_b.step();
  ExpectSameTensors(ModelStateOfModule(b, kLayers), ModelStateOfModule(reference, kLayers));
}

// Saved on one device, loaded onto another: (save, load) over cpu and cuda.
// A GPU's tensors go to disk through pinned host buffers; loading puts the
// values (and the optimizer's state) on whatever device the loading model is
// on, and training continues bitwise as if nothing had moved.
class CheckpointDeviceTest : public ::testing::TestWithParam<std::pair<DeviceKind, DeviceKind>> {};

TEST_P(CheckpointDeviceTest, RoundTripMapsToTheLoadingDevice) {
  absl::StatusOr<c10::Device> save_device = TestDevice(GetParam().first);
  if (!save_device.ok()) GTEST_SKIP() << save_device.status().message();
  absl::StatusOr<c10::Device> load_device = TestDevice(GetParam().second);
  if (!load_device.ok()) GTEST_SKIP() << load_device.status().message();
  const std::string root = FreshDir("device");
  auto options = torch::optim::SGDOptions(0.1).momentum(0.9);
  ToyStage a(0, kLayers, true);
  a.to(*save_device);
  torch::optim::SGD opt_a(a.parameters(), options);
  SetGrads(a);
  opt_a.step();
  ModelState state = ModelStateOfModule(a, kLayers);
  SaveRequest request;
  request.root = root;
  request.step = 1;
  request.model = &state;
  request.optimizer = &opt_a;
  absl::StatusOr<std::string> saved = SaveCheckpoint(request, CheckpointRank());
  ASSERT_TRUE(saved.ok()) << saved.status();

  ToyStage b(0, kLayers, true, /*seed=*/5);
  b.to(*load_device);
  ModelState loaded = ModelStateOfModule(b, kLayers);
  torch::optim::SGD opt_b(b.parameters(), options);
  auto report = LoadCheckpoint(root, loaded, &opt_b, CheckpointRank());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->clean()) << report->Summary();
  const ModelState after_load = ModelStateOfModule(b, kLayers);
  ASSERT_EQ(after_load.tensors.size(), state.tensors.size());
  for (size_t i = 0; i < state.tensors.size(); ++i) {
    EXPECT_EQ(after_load.tensors[i].first, state.tensors[i].first);
    EXPECT_EQ(after_load.tensors[i].second.device(), *load_device) << state.tensors[i].first;
    EXPECT_TRUE(torch::equal(after_load.tensors[i].second.cpu(), state.tensors[i].second.cpu()))
        << state.tensors[i].first;
  }
  // One more step on each: the momentum came back too, on the loading device.
  SetGrads(a);
  opt_a.step();
  SetGrads(b);
  opt_b.step();
  const ModelState final_a = ModelStateOfModule(a, kLayers);
  const ModelState final_b = ModelStateOfModule(b, kLayers);
  for (size_t i = 0; i < final_a.tensors.size(); ++i) {
    EXPECT_TRUE(torch::equal(final_a.tensors[i].second.cpu(), final_b.tensors[i].second.cpu()))
        << final_a.tensors[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, CheckpointDeviceTest,
                         ::testing::Values(std::make_pair(DeviceKind::kCpu, DeviceKind::kCpu),
                                           std::make_pair(DeviceKind::kCuda, DeviceKind::kCpu),
                                           std::make_pair(DeviceKind::kCpu, DeviceKind::kCuda),
                                           std::make_pair(DeviceKind::kCuda, DeviceKind::kCuda)),
                         [](const auto& info) {
                           return DeviceKindName(info.param.first) + "_to_" +
                                  DeviceKindName(info.param.second);
                         });

TEST(SaveRequestTest, MultiRankSaveWithoutWorldGroupIsRefused) {
  ModelState state;
  SaveRequest request;
  request.root = FreshDir("noworld");
  request.model = &state;
  CheckpointRank rank;
  rank.world_size = 2;
  auto r = SaveCheckpoint(request, rank);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

class StrictnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = FreshDir("strict");
    ToyStage model(0, kLayers, true);
    ModelState state = ModelStateOfModule(model, kLayers);
    SaveRequest request;
    request.root = root_;
    request.step = 1;
    request.model = &state;
    auto dir = SaveCheckpoint(request, CheckpointRank());
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
  }
  std::string root_, dir_;
};

TEST_F(StrictnessTest, MissingLayerFile) {
  ToyStage bigger(0, kLayers + 1, true, 1);
  ModelState state = ModelStateOfModule(bigger, kLayers + 1);
  auto strict = LoadCheckpoint(root_, state, nullptr, CheckpointRank());
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(strict.status().message().find("layer_06-model_states.pt"), std::string::npos)
      << strict.status();
  auto loose = LoadCheckpoint(root_, state, nullptr, CheckpointRank(), {.strict = false});
  ASSERT_TRUE(loose.ok()) << loose.status();
  EXPECT_EQ(loose->missing, (std::vector<std::string>{"layers.6.weight", "layers.6.bias"}));
  EXPECT_TRUE(loose->unexpected.empty());
}

TEST_F(StrictnessTest, UnexpectedLayersAndTie) {
  ToyStage smaller(0, kLayers - 1, false, 1);
  ModelState state = ModelStateOfModule(smaller, kLayers - 1);
  auto strict = LoadCheckpoint(root_, state, nullptr, CheckpointRank());
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(strict.status().message().find("layer_05-model_states.pt"), std::string::npos)
      << strict.status();
  auto loose = LoadCheckpoint(root_, state, nullptr, CheckpointRank(), {.strict = false});
  ASSERT_TRUE(loose.ok()) << loose.status();
  EXPECT_EQ(loose->unexpected,
            (std::vector<std::string>{"tied_emb-model_states.pt", "layer_05-model_states.pt"}));
  EXPECT_EQ(loose->tensors_loaded, static_cast<int64_t>(state.tensors.size()));
}

TEST_F(StrictnessTest, ShapeMismatchNamesTensorShapesAndFile) {
  ToyStage wide(0, kLayers, true, 1, /*width=*/4);
  ModelState state = ModelStateOfModule(wide, kLayers);
  auto strict = LoadCheckpoint(root_, state, nullptr, CheckpointRank());
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(strict.status().message());
  EXPECT_NE(msg.find("layers.0.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[8, 8]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer_00-model_states.pt"), std::string::npos) << msg;
  auto loose = LoadCheckpoint(root_, state, nullptr, CheckpointRank(), {.strict = false});
  ASSERT_TRUE(loose.ok());
  EXPECT_EQ(loose->shape_mismatches.size(), state.tensors.size() - 1);  // num_batches_tracked fits
}

TEST_F(StrictnessTest, OptimizerStateMissingWhenCheckpointHasNone) {
  ToyStage model(0, kLayers, true, 1);
  ModelState state = ModelStateOfModule(model, kLayers);
  torch::optim::AdamW optimizer(model.parameters());
  // A checkpoint saved before any optimizer step has no optimizer files: fine
  // in strict mode, the report lists the parameters without state.
  auto report = LoadCheckpoint(root_, state, &optimizer, CheckpointRank());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->optimizer_missing.size(), model.parameters().size());
  EXPECT_TRUE(optimizer.state().empty());
}

TEST_F(StrictnessTest, CorruptedLayerFileIsNamedOnLoad) {
  std::string file = (fs::path(dir_) / "layer_02-model_states.pt").string();
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(200);
  char c;
  f.seekg(200);
  f.get(c);
  f.seekp(200);
  f.put(static_cast<char>(c ^ 0x40));
  f.close();
  ToyStage model(0, kLayers, true, 1);
  ModelState state = ModelStateOfModule(model, kLayers);
  auto r = LoadCheckpoint(root_, state, nullptr, CheckpointRank(), {.strict = false});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find(file), std::string::npos) << r.status();
}

}  // namespace
}  // namespace pp
