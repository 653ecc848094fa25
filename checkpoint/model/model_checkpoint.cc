#include "checkpoint/model/model_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <typeinfo>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Type.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <glog/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"
#include "common/torch_status.h"
#include "topology/wait_work.h"

namespace pp {
namespace {

namespace fs = std::filesystem;
using checkpoint::FileInfo;
using checkpoint::Manifest;

constexpr char kModelKind[] = "model";
constexpr char kOptimKind[] = "optim";
constexpr char kRankStateKind[] = "rank_state";

torch_compat::OptimizerStateKey ParamKey(const at::Tensor& t) {
  return torch_compat::OptimizerStateKeyOf(t);
}

std::string ModelSuffix(int model_rank, int model_size) {
  return model_size > 1 ? absl::StrFormat("-model_%02d", model_rank) : "";
}

}  // namespace

absl::StatusOr<TensorDict> OptimizerStateTensors(const torch::optim::Optimizer& optimizer,
                                                 const at::Tensor& param, const std::string& name) {
  TensorDict out;
  auto it = optimizer.state().find(ParamKey(param));
  if (it == optimizer.state().end()) return out;  // No step taken yet.
  const torch::optim::OptimizerParamState* state = it->second.get();
  if (state == nullptr) {
    return absl::InternalError(absl::StrCat("the optimizer's state of ", name, " is empty"));
  }
  auto adam_like = [&](int64_t step, const at::Tensor& m, const at::Tensor& v,
                       const at::Tensor& vmax) {
    out.emplace_back("step", at::scalar_tensor(step, at::kLong));
    out.emplace_back("exp_avg", m);
    out.emplace_back("exp_avg_sq", v);
    if (vmax.defined()) out.emplace_back("max_exp_avg_sq", vmax);
  };
  if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
    adam_like(s->step(), s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq());
  } else if (const auto* s = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
    adam_like(s->step(), s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq());
  } else if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
    if (s->momentum_buffer().defined()) out.emplace_back("momentum_buffer", s->momentum_buffer());
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "cannot checkpoint the optimizer state of ", name, " (a ",
        c10::demangle(typeid(*state).name()), "): only Adam, AdamW and SGD states are supported"));
  }
  return out;
}

absl::Status SetOptimizerStateTensors(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                      const std::string& name,
                                      const std::map<std::string, at::Tensor>& entries,
                                      const std::string& file) {
  auto get = [&](const std::string& suffix) -> at::Tensor {
    auto it = entries.find(suffix);
    if (it == entries.end()) return at::Tensor();
    // The loaded tensor aliases the file's mapping: give the optimizer its own memory.
    return it->second.to(param.device(), /*non_blocking=*/false, /*copy=*/true);
  };
  auto need = [&](const std::string& suffix) -> absl::StatusOr<at::Tensor> {
    at::Tensor t = get(suffix);
    if (!t.defined()) {
      return absl::DataLossError(
          absl::StrCat("optimizer state of ", name, " in ", file, " lacks '", suffix, "'"));
    }
    if (suffix != "step" && !t.sizes().equals(param.sizes())) {
      return absl::DataLossError(absl::StrCat("optimizer state ", name, ".", suffix, " in ", file,
                                              " has shape ", c10::str(t.sizes()),
                                              ", the parameter ", c10::str(param.sizes())));
    }
    return t;
  };
  std::unique_ptr<torch::optim::OptimizerParamState> state;
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr ||
      dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr) {
    PP_ASSIGN_OR_RETURN(at::Tensor step, need("step"));
    PP_ASSIGN_OR_RETURN(at::Tensor m, need("exp_avg"));
    PP_ASSIGN_OR_RETURN(at::Tensor v, need("exp_avg_sq"));
    at::Tensor vmax = get("max_exp_avg_sq");
    if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(step.item<int64_t>()).exp_avg(m).exp_avg_sq(v).max_exp_avg_sq(vmax);
      state = std::move(s);
    } else {
      auto s = std::make_unique<torch::optim::AdamParamState>();
      s->step(step.item<int64_t>()).exp_avg(m).exp_avg_sq(v).max_exp_avg_sq(vmax);
      state = std::move(s);
    }
  } else if (dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr) {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(get("momentum_buffer"));
    state = std::move(s);
  } else {
    return absl::UnimplementedError(absl::StrCat("cannot load optimizer state of ", name,
                                                 ": only Adam, AdamW and SGD are supported"));
  }
  optimizer.state()[ParamKey(param)] = std::move(state);
  return absl::OkStatus();
}

absl::Status AgreeOnCheckpointStatus(const CheckpointRank& rank, const absl::Status& local,
                                     const std::string& phase) {
  if (rank.world == nullptr || rank.world_size <= 1) return local;
  at::Tensor flag = at::full({1}, local.ok() ? rank.world_size : rank.rank, at::kInt);
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MIN;
  opts.timeout = rank.timeout;
  std::vector<at::Tensor> tensors = {flag};
  std::vector<int> world_ranks(rank.world_size);
  for (int r = 0; r < rank.world_size; ++r) world_ranks[r] = r;
  PP_RETURN_IF_ERROR(RunCollective(absl::StrCat("checkpoint ", phase, ": agreeing on success"),
                                   DescribeGroup("world group", world_ranks, rank.rank),
                                   rank.timeout,
                                   [&] { return rank.world->allreduce(tensors, opts); }));
  if (!local.ok()) return local;
  int failed = flag.item<int>();
  if (failed < rank.world_size) {
    return absl::AbortedError(absl::StrCat("checkpoint ", phase, " failed on rank ", failed,
                                           " (see its log); nothing was committed"));
  }
  return absl::OkStatus();
}

namespace {

absl::Status AgreeOk(const CheckpointRank& rank, const absl::Status& local,
                     const std::string& phase) {
  return AgreeOnCheckpointStatus(rank, local, phase);
}

// A random token drawn by rank 0 and shared with every rank (a sum over the
// world group: the others add 0), naming this save's temporary folder.
absl::StatusOr<std::string> ShareWriterToken(const CheckpointRank& rank) {
  int64_t token = 0;
  if (rank.rank == 0) {
    std::random_device device;
    token = static_cast<int64_t>((static_cast<uint64_t>(device()) << 31) ^ device()) &
            ((int64_t{1} << 62) - 1);
  }
  if (rank.world != nullptr && rank.world_size > 1) {
    std::vector<at::Tensor> tensors = {at::full({1}, token, at::kLong)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = rank.timeout;
    std::vector<int> world_ranks(rank.world_size);
    for (int r = 0; r < rank.world_size; ++r) world_ranks[r] = r;
    PP_RETURN_IF_ERROR(RunCollective("checkpoint: sharing the save's temporary folder name",
                                     DescribeGroup("world group", world_ranks, rank.rank),
                                     rank.timeout,
                                     [&] { return rank.world->allreduce(tensors, opts); }));
    token = tensors[0].item<int64_t>();
  }
  return absl::StrFormat("%016x", token);
}

struct FileJob {
  std::string kind;
  int64_t layer = -1;
  std::string tie_key;
  TensorDict tensors;
  // A data-parallel rank's own part of the optimizer state: written by every
  // data rank (not spread), each entry a slice: entry -> (offset, whole shape).
  bool data_slice = false;
  std::map<std::string, std::pair<int64_t, std::vector<int64_t>>> slices;
};

// The model and optimizer files of this rank's stage (all data-parallel ranks
// of a stage compute the same plan), by file name.
absl::StatusOr<std::map<std::string, FileJob>> PlanStageFiles(const SaveRequest& request,
                                                              const CheckpointRank& rank) {
  std::map<std::string, FileJob> jobs;
  for (const auto& [name, tensor] : request.model->tensors) {
    PP_ASSIGN_OR_RETURN(TensorLocation loc, LocateTensor(name));
    std::string model_file, optim_file;
    if (!loc.tie_key.empty()) {
      auto it = request.model->tie_writer_stage.find(loc.tie_key);
      int writer_stage = it == request.model->tie_writer_stage.end() ? rank.stage : it->second;
      if (writer_stage != rank.stage) continue;
      model_file = TiedFileName(loc.tie_key, rank.model_rank, rank.model_size, kModelKind);
      optim_file = TiedFileName(loc.tie_key, rank.model_rank, rank.model_size, kOptimKind);
    } else {
      model_file = LayerFileName(loc.layer, rank.model_rank, rank.model_size, kModelKind);
      optim_file = LayerFileName(loc.layer, rank.model_rank, rank.model_size, kOptimKind);
    }
    FileJob& job = jobs[model_file];
    job.kind = kModelKind;
    job.layer = loc.layer;
    job.tie_key = loc.tie_key;
    job.tensors.emplace_back(loc.local, tensor);
    if (request.optimizer != nullptr) {
      PP_ASSIGN_OR_RETURN(TensorDict state,
                          OptimizerStateTensors(*request.optimizer, tensor, name));
      if (state.empty()) continue;
      FileJob& ojob = jobs[optim_file];
      ojob.kind = kOptimKind;
      ojob.layer = loc.layer;
      ojob.tie_key = loc.tie_key;
      for (auto& [suffix, t] : state)
        ojob.tensors.emplace_back(absl::StrCat(loc.local, ".", suffix), t);
    }
    auto slice = request.optimizer_slices.find(name);
    if (request.slices_optimizer != nullptr && slice != request.optimizer_slices.end() &&
        slice->second.value.defined()) {
      PP_ASSIGN_OR_RETURN(TensorDict state, OptimizerStateTensors(*request.slices_optimizer,
                                                                  slice->second.value, name));
      if (state.empty()) continue;
      FileJob& sjob = jobs[DataSliceFileName(optim_file, rank.data_rank)];
      sjob.kind = kOptimKind;
      sjob.layer = loc.layer;
      sjob.tie_key = loc.tie_key;
      sjob.data_slice = true;
      for (auto& [suffix, t] : state) {
        const std::string entry = absl::StrCat(loc.local, ".", suffix);
        // The step is a scalar every part holds; the rest are slices.
        if (t.dim() == 1 && t.numel() == slice->second.value.numel()) {
          sjob.slices[entry] = {slice->second.offset, tensor.sizes().vec()};
        }
        sjob.tensors.emplace_back(entry, t);
      }
    }
  }
  return jobs;
}

// The global name of the parameter a file entry belongs to: "layers.3." +
// "fc.weight" for "fc.weight" in a model file and "fc.weight.exp_avg" in an
// optimizer file.
std::string ParameterOfEntry(const std::string& prefix, const std::string& key,
                             const std::string& kind) {
  if (kind != kOptimKind) return prefix + key;
  const size_t dot = key.rfind('.');
  return prefix + (dot == std::string::npos ? key : key.substr(0, dot));
}

std::string PrefixOf(int64_t layer, const std::string& tie_key) {
  return tie_key.empty() ? absl::StrCat("layers.", layer, ".")
                         : absl::StrCat("tied.", tie_key, ".");
}

// Marks the file's tensor-parallel shards in its TensorInfos.
void RecordShards(const ModelState& model, const FileJob& job, FileInfo& info) {
  if (model.shard_dims.empty()) return;
  const std::string prefix = PrefixOf(job.layer, job.tie_key);
  for (checkpoint::TensorInfo& t : *info.mutable_tensors()) {
    auto it = model.shard_dims.find(ParameterOfEntry(prefix, t.name(), job.kind));
    if (it == model.shard_dims.end() || t.shape().empty()) continue;  // whole, or a scalar step
    t.set_shard_blocks(static_cast<int32_t>(it->second.blocks));
    t.set_shard_dim(static_cast<int32_t>(it->second.dim));
    if (it->second.replicas > 1) t.set_shard_replicas(static_cast<int32_t>(it->second.replicas));
  }
}

absl::StatusOr<std::vector<FileInfo>> WriteMyFiles(const SaveRequest& request,
                                                   const CheckpointRank& rank,
                                                   const std::string& tmp) {
  PP_ASSIGN_OR_RETURN(auto jobs, PlanStageFiles(request, rank));
  std::vector<FileInfo> written;
  int index = 0;
  for (const auto& [file, job] : jobs) {
    // Spread the stage's files over its data-parallel ranks; each writes its
    // own parts of a distributed optimizer's state.
    if (!job.data_slice && index++ % rank.data_size != rank.data_rank) continue;
    PP_ASSIGN_OR_RETURN(FileInfo info, WriteTensorFile(tmp, file, job.tensors, /*sync=*/false));
    RecordShards(*request.model, job, info);
    for (checkpoint::TensorInfo& t : *info.mutable_tensors()) {
      auto slice = job.slices.find(t.name());
      if (slice == job.slices.end()) continue;
      t.set_sliced(true);
      t.set_slice_offset(slice->second.first);
      for (int64_t d : slice->second.second) t.add_slice_of(d);
    }
    info.set_kind(job.kind);
    info.set_layer(static_cast<int32_t>(job.layer));
    info.set_tie_key(job.tie_key);
    info.set_writer_rank(rank.rank);
    written.push_back(std::move(info));
  }
  if (!request.rank_state.empty()) {
    PP_ASSIGN_OR_RETURN(
        FileInfo info,
        WriteTensorFile(tmp, RankStateFileName(rank.stage, rank.data_rank, rank.model_rank),
                        request.rank_state));
    info.set_kind(kRankStateKind);
    info.set_layer(-1);
    info.set_writer_rank(rank.rank);
    written.push_back(std::move(info));
  }
  // Durable before this rank reports success (the commit relies on it).
  for (const FileInfo& f : written)
    PP_RETURN_IF_ERROR(SyncFile((fs::path(tmp) / f.path()).string()));
  return written;
}

}  // namespace

ModelState ModelStateOfModule(const torch::nn::Module& module, int64_t num_layers) {
  ModelState state;
  state.num_layers = num_layers;
  std::set<const void*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second)
      state.tensors.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second)
      state.tensors.emplace_back(item.key(), item.value());
  }
  return state;
}

absl::StatusOr<TensorLocation> LocateTensor(const std::string& name) {
  TensorLocation loc;
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor name '", name,
        "' is not a global name: expected layers.<index>.<name> or tied.<key>.<name>"));
  };
  absl::string_view rest(name);
  if (absl::ConsumePrefix(&rest, "layers.")) {
    size_t dot = rest.find('.');
    if (dot == absl::string_view::npos || dot + 1 == rest.size()) return bad();
    if (!absl::SimpleAtoi(rest.substr(0, dot), &loc.layer) || loc.layer < 0) return bad();
    loc.local = std::string(rest.substr(dot + 1));
    return loc;
  }
  if (absl::ConsumePrefix(&rest, "tied.")) {
    size_t dot = rest.find('.');
    if (dot == 0 || dot == absl::string_view::npos || dot + 1 == rest.size()) return bad();
    loc.tie_key = std::string(rest.substr(0, dot));
    loc.local = std::string(rest.substr(dot + 1));
    return loc;
  }
  return bad();
}

std::string LayerFileName(int64_t layer, int model_rank, int model_size, const std::string& kind) {
  return absl::StrFormat("layer_%02d%s-%s_states.pt", layer, ModelSuffix(model_rank, model_size),
                         kind);
}

std::string DataSliceFileName(const std::string& optim_file, int data_rank) {
  const std::string tail = absl::StrCat("-", kOptimKind, "_states.pt");
  CHECK(absl::EndsWith(optim_file, tail)) << optim_file << " is not an optimizer file";
  return absl::StrFormat("%s-data_%02d%s", optim_file.substr(0, optim_file.size() - tail.size()),
                         data_rank, tail);
}

std::string TiedFileName(const std::string& key, int model_rank, int model_size,
                         const std::string& kind) {
  return absl::StrFormat("tied_%s%s-%s_states.pt", key, ModelSuffix(model_rank, model_size), kind);
}

std::string RankStateFileName(int stage, int data_rank, int model_rank) {
  return absl::StrFormat("rank_state-pipe_%02d-data_%02d-model_%02d.pt", stage, data_rank,
                         model_rank);
}

absl::StatusOr<std::string> SaveCheckpoint(const SaveRequest& request, const CheckpointRank& rank) {
  if (request.model == nullptr) return absl::InvalidArgumentError("SaveRequest.model is null");
  if (request.root.empty()) return absl::InvalidArgumentError("SaveRequest.root is empty");
  if (rank.data_size < 1 || rank.data_rank < 0 || rank.data_rank >= rank.data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_rank ", rank.data_rank, " must be in [0, ", rank.data_size, ")"));
  }
  if (rank.world_size > 1 && rank.world == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("CheckpointRank.world is null with world_size ",
                                                   rank.world_size,
                                                   ": a multi-rank save needs the world group"));
  }
  const std::string name = CheckpointName(request.step);
  PP_ASSIGN_OR_RETURN(const std::string writer, ShareWriterToken(rank));
  const std::string tmp = TempCheckpointDir(request.root, name, writer);

  // Rank 0 holds the temporary folder (an flock) until its commit, so no
  // other save's pruning deletes it meanwhile.
  int hold = -1;
  struct CloseHold {
    int* fd;
    ~CloseHold() {
      if (*fd >= 0) ::close(*fd);
    }
  } close_hold{&hold};
  absl::Status prepared = absl::OkStatus();
  if (rank.rank == 0) {
    prepared = PrepareTempCheckpointDir(request.root, name, writer, &hold).status();
  }
  PP_RETURN_IF_ERROR(AgreeOk(rank, prepared, "preparing " + tmp));

  absl::Status wrote = [&]() -> absl::Status {
    PP_ASSIGN_OR_RETURN(std::vector<FileInfo> files, WriteMyFiles(request, rank, tmp));
    return WritePartialManifest(tmp, rank.rank, files);
  }();
  // A failed save removes its temporary folder once every rank has stopped
  // writing (after the agreement): on a full disk it held the space every
  // retry needs (issue #42, class 7).
  auto discard = [&](absl::Status failed) {
    if (rank.rank == 0) {
      if (absl::Status removed = RemoveTree(tmp); !removed.ok()) {
        failed = absl::Status(failed.code(),
                              absl::StrCat(failed.message(), "; and ", removed.message()));
      }
    }
    return failed;
  };
  if (absl::Status agreed = AgreeOk(rank, wrote, "writing files into " + tmp); !agreed.ok()) {
    return discard(agreed);
  }

  absl::Status committed = absl::OkStatus();
  if (rank.rank == 0) {
    Manifest header;
    header.mutable_topology()->CopyFrom(request.topology);
    if (header.topology().pipe() == 0) header.mutable_topology()->set_pipe(rank.num_stages);
    if (header.topology().data() == 0) header.mutable_topology()->set_data(rank.data_size);
    if (header.topology().model() == 0) header.mutable_topology()->set_model(rank.model_size);
    header.set_config(request.config);
    *header.mutable_trainer() = request.trainer;
    header.mutable_trainer()->set_step(request.step);
    header.set_num_layers(static_cast<int32_t>(request.model->num_layers));
    for (const auto& [k, v] : request.metadata) (*header.mutable_metadata())[k] = v;
    header.set_owner(request.owner);
    committed = CommitCheckpoint(request.root, name, header, request.keep_last, writer).status();
  }
  if (absl::Status agreed = AgreeOk(rank, committed, "committing " + name); !agreed.ok()) {
    return discard(agreed);
  }
  return (fs::path(request.root) / name).string();
}

std::string LoadReport::Summary() const {
  std::vector<std::string> lines;
  lines.push_back(absl::StrFormat("loaded %d tensors and %d optimizer states (%d bytes) from %s",
                                  tensors_loaded, optimizer_states_loaded, bytes_read, dir));
  if (!missing.empty()) lines.push_back("missing: " + absl::StrJoin(missing, ", "));
  if (!unexpected.empty()) lines.push_back("unexpected: " + absl::StrJoin(unexpected, ", "));
  if (!shape_mismatches.empty())
    lines.push_back("shape mismatches: " + absl::StrJoin(shape_mismatches, "; "));
  if (!optimizer_missing.empty()) {
    lines.push_back("no optimizer state for: " + absl::StrJoin(optimizer_missing, ", "));
  }
  return absl::StrJoin(lines, "\n");
}

namespace {

// LoadCheckpoint's steps, in order. Each adds to the report; in strict mode
// the first difference is an error instead.

// The manifest's files by path.
using FilesByPath = std::map<std::string, const FileInfo*>;

// One tensor of the model, and its name inside its checkpoint file.
struct WantedTensor {
  std::string global;
  std::string local;
  at::Tensor tensor;
};

// What a planned file holds: a layer's or tie key's model or optimizer states.
struct FileSource {
  int64_t layer = -1;
  std::string tie_key;
  std::string kind;
};

// Which file each of our tensors (and optimizer states) lives in.
struct LoadPlan {
  std::map<std::string, std::vector<WantedTensor>> model_files, optim_files;
  std::map<std::string, FileSource> source_of_file;

  // "layers.7." / "tied.wte.": what a planned file's keys are local to.
  std::string PrefixOfFile(const std::string& file) const {
    const FileSource& source = source_of_file.at(file);
    return PrefixOf(source.layer, source.tie_key);
  }
};

absl::StatusOr<LoadPlan> PlanLoad(const ModelState& model, torch::optim::Optimizer* optimizer,
                                  const CheckpointRank& rank, const LoadOptions& options) {
  LoadPlan plan;
  std::set<torch_compat::OptimizerStateKey> optimizer_params;
  if (optimizer != nullptr && options.load_optimizer) {
    for (const auto& group : optimizer->param_groups()) {
      for (const at::Tensor& p : group.params()) optimizer_params.insert(ParamKey(p));
    }
  }
  for (const auto& [name, tensor] : model.tensors) {
    PP_ASSIGN_OR_RETURN(TensorLocation loc, LocateTensor(name));
    std::string mfile, ofile;
    if (loc.tie_key.empty()) {
      mfile = LayerFileName(loc.layer, rank.model_rank, rank.model_size, kModelKind);
      ofile = LayerFileName(loc.layer, rank.model_rank, rank.model_size, kOptimKind);
    } else {
      mfile = TiedFileName(loc.tie_key, rank.model_rank, rank.model_size, kModelKind);
      ofile = TiedFileName(loc.tie_key, rank.model_rank, rank.model_size, kOptimKind);
    }
    plan.source_of_file[mfile] = {loc.layer, loc.tie_key, kModelKind};
    plan.source_of_file[ofile] = {loc.layer, loc.tie_key, kOptimKind};
    plan.model_files[mfile].push_back({name, loc.local, tensor});
    if (optimizer_params.count(ParamKey(tensor)) > 0)
      plan.optim_files[ofile].push_back({name, loc.local, tensor});
  }
  return plan;
}

// `whole` made `want` long along `dim`: a vocabulary padded for another
// tensor-parallel size gets zero rows or loses rows, which must then be zero
// (padding never trains; anything else is not padding).
absl::StatusOr<at::Tensor> FitAlong(const at::Tensor& whole, int64_t dim, int64_t want,
                                    const std::string& what) {
  const int64_t have = whole.size(dim);
  if (have == want) return whole;
  if (have < want) {
    std::vector<int64_t> pad = whole.sizes().vec();
    pad[dim] = want - have;
    return at::cat({whole, at::zeros(pad, whole.options())}, dim);
  }
  if (at::count_nonzero(whole.narrow(dim, want, have - want)).item<int64_t>() != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the checkpoint's whole tensor has ", have, " rows along dim ", dim,
                     ", this model ", want, ", and the rows beyond ", want,
                     " are not zero (not vocabulary padding)"));
  }
  return whole.narrow(dim, 0, want).contiguous();
}

// Reads the files a plan names. When the checkpoint was saved with another
// tensor-parallel size (`from`), a planned file (this rank's layout) is made
// from the checkpoint ranks' files of the same layer and kind: each shard's
// slices merged by the split the manifest records, fitted to this model's
// (padded) size, and this rank's slice cut by the model's own split.
class PlannedFiles {
 public:
  PlannedFiles(const LoadPlan& plan, const FilesByPath& by_path, const ModelState& model,
               const CheckpointRank& rank, int from, int data_from)
      : plan_(plan),
        by_path_(by_path),
        model_(model),
        rank_(rank),
        from_(std::max(1, from)),
        data_from_(std::max(1, data_from)) {
    for (const auto& [name, t] : model.tensors) live_[name] = t;
  }

  bool resharding() const { return from_ != rank_.model_size; }

  // Null when the checkpoint has no such file (none of its sources).
  absl::StatusOr<std::optional<TensorDict>> Read(const std::string& file, LoadReport& report) {
    if (!resharding()) {
      PP_ASSIGN_OR_RETURN(std::optional<FileRead> read, ReadFile(file, report));
      if (!read.has_value()) return std::optional<TensorDict>();
      return std::optional<TensorDict>(std::move(read->tensors));
    }
    const FileSource& src = plan_.source_of_file.at(file);
    std::vector<std::map<std::string, at::Tensor>> parts;
    const FileInfo* first = nullptr;
    std::string first_name;
    for (int m = 0; m < from_; ++m) {
      const std::string name = src.tie_key.empty() ? LayerFileName(src.layer, m, from_, src.kind)
                                                   : TiedFileName(src.tie_key, m, from_, src.kind);
      PP_ASSIGN_OR_RETURN(std::optional<FileRead> read, ReadFile(name, report));
      if (!read.has_value()) {
        if (m == 0) return std::optional<TensorDict>();
        return absl::NotFoundError(absl::StrCat("checkpoint ", report.dir, " has ", first_name,
                                                " but not ", name, " (tensor-parallel rank ", m,
                                                " of ", from_, ")"));
      }
      if (m == 0) {
        first = read->info;
        first_name = name;
      }
      parts.emplace_back(read->tensors.begin(), read->tensors.end());
    }
    std::map<std::string, tensor_parallel::ShardSpec> saved;
    for (const checkpoint::TensorInfo& t : first->tensors()) {
      if (t.shard_blocks() > 0) {
        saved[t.name()] = {t.shard_dim(), t.shard_blocks(), std::max(1, t.shard_replicas())};
      }
    }
    TensorDict out;
    const std::string prefix = PrefixOf(src.layer, src.tie_key);
    for (const auto& [key, tensor] : parts[0]) {
      const std::string what =
          absl::StrCat(ParameterOfEntry(prefix, key, src.kind), " (", first_name,
                       ", resharded from tp ", from_, " to ", rank_.model_size, ")");
      at::Tensor whole = tensor;
      std::optional<tensor_parallel::ShardSpec> dim_spec;
      if (auto s = saved.find(key); s != saved.end()) {
        std::vector<at::Tensor> pieces;
        for (int m = 0; m < from_; ++m) {
          auto piece = parts[m].find(key);
          if (piece == parts[m].end()) {
            return absl::NotFoundError(
                absl::StrCat(what, ": tensor-parallel rank ", m, "'s file has no '", key, "'"));
          }
          pieces.push_back(piece->second);
        }
        PP_RETURN_IF_ERROR(TorchCall(absl::StrCat("merging the shards of ", what), [&] {
          whole = tensor_parallel::MergeShards(pieces, s->second);
        }));
        dim_spec = s->second;
      }
      const std::string param = ParameterOfEntry(prefix, key, src.kind);
      auto live = live_.find(param);
      auto spec = model_.shard_dims.find(param);
      const bool split = spec != model_.shard_dims.end() && rank_.model_size > 1;
      if (split) dim_spec = spec->second;
      // Optimizer steps are scalars; a tensor of another rank is the
      // loader's to report.
      if (live != live_.end() && whole.dim() > 0 && whole.dim() == live->second.dim() &&
          dim_spec.has_value() && dim_spec->blocks == 1) {
        const int64_t d = dim_spec->dim;
        const int64_t slices = split ? rank_.model_size / dim_spec->replicas : 1;
        PP_ASSIGN_OR_RETURN(whole, FitAlong(whole, d, live->second.size(d) * slices, what));
      }
      if (split && whole.dim() == live->second.dim()) {
        PP_RETURN_IF_ERROR(TorchCall(
            absl::StrCat("cutting tensor-parallel rank ", rank_.model_rank, "'s slice of ", what),
            [&] {
              whole =
                  tensor_parallel::ShardOf(whole, spec->second, rank_.model_rank, rank_.model_size)
                      .contiguous();
            }));
      }
      out.emplace_back(key, whole);
    }
    return std::optional<TensorDict>(std::move(out));
  }

 private:
  struct FileRead {
    TensorDict tensors;
    const FileInfo* info;  // the (first part's) manifest entry: its shard specs
  };

  // `name` as written, or put together from the data-parallel ranks' parts
  // of it (SaveRequest::optimizer_slices); null if the checkpoint has
  // neither.
  absl::StatusOr<std::optional<FileRead>> ReadFile(const std::string& name, LoadReport& report) {
    auto it = by_path_.find(name);
    if (it != by_path_.end()) {
      PP_ASSIGN_OR_RETURN(TensorDict d, ReadTensorFile(report.dir, *it->second));
      report.bytes_read += it->second->size_bytes();
      return std::optional<FileRead>(FileRead{std::move(d), it->second});
    }
    if (!absl::EndsWith(name, absl::StrCat("-", kOptimKind, "_states.pt"))) {
      return std::optional<FileRead>();
    }
    std::map<std::string, at::Tensor> whole;
    std::map<std::string, int64_t> covered;
    std::map<std::string, std::vector<int64_t>> shapes;
    std::vector<std::string> read_files;
    const FileInfo* first = nullptr;
    for (int d = 0; d < data_from_; ++d) {
      const std::string part = DataSliceFileName(name, d);
      auto p = by_path_.find(part);
      if (p == by_path_.end()) continue;  // that rank owns nothing of this layer
      PP_ASSIGN_OR_RETURN(TensorDict tensors, ReadTensorFile(report.dir, *p->second));
      report.bytes_read += p->second->size_bytes();
      read_files.push_back(part);
      if (first == nullptr) first = p->second;
      std::map<std::string, const checkpoint::TensorInfo*> infos;
      for (const checkpoint::TensorInfo& t : p->second->tensors()) infos[t.name()] = &t;
      for (auto& [key, t] : tensors) {
        auto info = infos.find(key);
        if (info == infos.end() || !info->second->sliced()) {
          whole.emplace(key, t);  // the step, the same in every part
          continue;
        }
        const checkpoint::TensorInfo& ti = *info->second;
        const std::vector<int64_t> shape(ti.slice_of().begin(), ti.slice_of().end());
        int64_t numel = 1;
        for (int64_t n : shape) numel *= n;
        at::Tensor& out = whole[key];
        if (!out.defined()) {
          out = at::zeros({numel}, t.options());
          shapes[key] = shape;
        }
        if (t.dim() != 1 || ti.slice_offset() < 0 || ti.slice_offset() + t.numel() > numel ||
            shapes[key] != shape) {
          return absl::DataLossError(absl::StrCat(
              "checkpoint ", report.dir, ": ", part, "'s '", key, "' (", t.numel(),
              " elements from ", ti.slice_offset(), ") is not a part of a tensor of ", numel));
        }
        out.narrow(0, ti.slice_offset(), t.numel()).copy_(t);
        covered[key] += t.numel();
      }
    }
    if (first == nullptr) return std::optional<FileRead>();
    TensorDict assembled;
    for (auto& [key, t] : whole) {
      if (auto s = shapes.find(key); s != shapes.end()) {
        if (covered[key] != t.numel()) {
          return absl::DataLossError(
              absl::StrCat("checkpoint ", report.dir, ": the data-parallel parts of '", key,
                           "' in ", absl::StrJoin(read_files, ", "), " hold ", covered[key],
                           " of its ", t.numel(), " elements (a part missing?)"));
        }
        t = t.view(s->second);
      }
      assembled.emplace_back(key, t);
    }
    return std::optional<FileRead>(FileRead{std::move(assembled), first});
  }

  const LoadPlan& plan_;
  const FilesByPath& by_path_;
  const ModelState& model_;
  const CheckpointRank& rank_;
  const int from_;
  const int data_from_;
  std::map<std::string, at::Tensor> live_;
};

// Copies the model's tensors in from their files. REQUIRES: grad mode off.
absl::Status LoadModelTensors(const LoadPlan& plan, PlannedFiles& files, const LoadOptions& options,
                              LoadReport& report) {
  for (const auto& [file, wanted] : plan.model_files) {
    PP_ASSIGN_OR_RETURN(std::optional<TensorDict> loaded, files.Read(file, report));
    if (!loaded.has_value()) {
      std::vector<std::string> names;
      for (const WantedTensor& w : wanted) names.push_back(w.global);
      if (options.strict) {
        return absl::NotFoundError(absl::StrCat("checkpoint ", report.dir, " has no file ", file,
                                                " (for ", absl::StrJoin(names, ", "), ")"));
      }
      report.missing.insert(report.missing.end(), names.begin(), names.end());
      continue;
    }
    std::map<std::string, at::Tensor> in_file(loaded->begin(), loaded->end());
    const std::string file_path = (fs::path(report.dir) / file).string();
    for (const WantedTensor& w : wanted) {
      auto found = in_file.find(w.local);
      if (found == in_file.end()) {
        if (options.strict) {
          return absl::NotFoundError(absl::StrCat("checkpoint file ", file_path, " has no tensor '",
                                                  w.local, "' (for ", w.global, ")"));
        }
        report.missing.push_back(w.global);
        continue;
      }
      const at::Tensor& src = found->second;
      if (!src.sizes().equals(w.tensor.sizes()) || src.scalar_type() != w.tensor.scalar_type()) {
        std::string what =
            absl::StrCat(w.global, ": checkpoint ", c10::toString(src.scalar_type()),
                         c10::str(src.sizes()), " vs model ", c10::toString(w.tensor.scalar_type()),
                         c10::str(w.tensor.sizes()), " (", file_path, ")");
        if (options.strict)
          return absl::FailedPreconditionError(absl::StrCat("shape mismatch for ", what));
        report.shape_mismatches.push_back(what);
        in_file.erase(found);
        continue;
      }
      PP_RETURN_IF_ERROR(
          TorchCall(absl::StrCat("copying ", w.global), [&] { w.tensor.copy_(src); }));
      ++report.tensors_loaded;
      in_file.erase(found);
    }
    for (const auto& [local, t] : in_file)
      report.unexpected.push_back(plan.PrefixOfFile(file) + local);
  }
  return absl::OkStatus();
}

// Installs the optimizer's state of each planned parameter from its file.
// REQUIRES: grad mode off; `optimizer` non-null when the plan has optimizer files.
absl::Status LoadOptimizerStates(const LoadPlan& plan, PlannedFiles& files,
                                 torch::optim::Optimizer* optimizer, LoadReport& report) {
  for (const auto& [file, wanted] : plan.optim_files) {
    PP_ASSIGN_OR_RETURN(std::optional<TensorDict> loaded, files.Read(file, report));
    std::map<std::string, at::Tensor> in_file;
    if (loaded.has_value()) in_file.insert(loaded->begin(), loaded->end());
    const std::string file_path = (fs::path(report.dir) / file).string();
    for (const WantedTensor& w : wanted) {
      std::map<std::string, at::Tensor> entries;
      const std::string prefix = w.local + ".";
      for (auto e = in_file.lower_bound(prefix);
           e != in_file.end() && absl::StartsWith(e->first, prefix);) {
        std::string suffix = e->first.substr(prefix.size());
        // "fc.weight.exp_avg" must not claim "fc.weight.extra.exp_avg" (another parameter's).
        if (suffix.find('.') != std::string::npos) {
          ++e;
          continue;
        }
        entries[suffix] = e->second;
        e = in_file.erase(e);
      }
      if (entries.empty()) {
        report.optimizer_missing.push_back(w.global);
        continue;
      }
      PP_RETURN_IF_ERROR(
          SetOptimizerStateTensors(*optimizer, w.tensor, w.global, entries, file_path));
      ++report.optimizer_states_loaded;
    }
    for (const auto& [key, t] : in_file)
      report.unexpected.push_back(plan.PrefixOfFile(file) + key + " (optimizer)");
  }
  return absl::OkStatus();
}

// Layers beyond the model and tie keys it does not have go to
// report.unexpected. Tie keys are known model-wide from tie_writer_stage, or
// when this rank holds the whole model.
void ReportFilesBeyondModel(const ModelState& model, const CheckpointRank& rank,
                            LoadReport& report) {
  std::set<std::string> known_ties;
  for (const auto& [key, stage] : model.tie_writer_stage) known_ties.insert(key);
  for (const auto& [name, t] : model.tensors) {
    absl::StatusOr<TensorLocation> loc = LocateTensor(name);
    if (loc.ok() && !loc->tie_key.empty()) known_ties.insert(loc->tie_key);
  }
  const bool ties_known = !model.tie_writer_stage.empty() || rank.num_stages == 1;
  for (const FileInfo& f : report.manifest.files()) {
    if ((model.num_layers >= 0 && f.layer() >= model.num_layers) ||
        (ties_known && !f.tie_key().empty() && known_ties.count(f.tie_key()) == 0)) {
      report.unexpected.push_back(f.path());
    }
  }
}

// This rank's own state (RNG, data loader), read only when the checkpoint was
// written by the same pipe x data layout. The ranks of a model group hold
// the same state (they are seeded alike and draw alike: tensor_parallel/
// dropout.h), so under another tensor-parallel size tp rank 0's serves.
absl::Status LoadRankState(const FilesByPath& by_path, const CheckpointRank& rank,
                           LoadReport& report) {
  const checkpoint::TopologyInfo& topo = report.manifest.topology();
  if (topo.pipe() != rank.num_stages || topo.data() != rank.data_size) return absl::OkStatus();
  const int saved_model_size = std::max(1, topo.model());
  const int model_rank = saved_model_size == rank.model_size ? rank.model_rank : 0;
  auto it = by_path.find(RankStateFileName(rank.stage, rank.data_rank, model_rank));
  if (it == by_path.end()) return absl::OkStatus();
  PP_ASSIGN_OR_RETURN(report.rank_state, ReadTensorFile(report.dir, *it->second));
  report.bytes_read += it->second->size_bytes();
  report.rank_state_found = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoadReport> LoadCheckpoint(const std::string& path, ModelState& model,
                                          torch::optim::Optimizer* optimizer,
                                          const CheckpointRank& rank, const LoadOptions& options) {
  LoadReport report;
  PP_ASSIGN_OR_RETURN(report.dir, ResolveCheckpointDir(path));
  PP_ASSIGN_OR_RETURN(report.manifest, ReadManifest(report.dir));
  FilesByPath by_path;
  bool has_optim_files = false;
  for (const FileInfo& f : report.manifest.files()) {
    by_path[f.path()] = &f;
    has_optim_files = has_optim_files || f.kind() == kOptimKind;
  }
  PP_ASSIGN_OR_RETURN(const LoadPlan plan, PlanLoad(model, optimizer, rank, options));

  torch::NoGradGuard no_grad;
  PlannedFiles files(plan, by_path, model, rank, report.manifest.topology().model(),
                     report.manifest.topology().data());
  PP_RETURN_IF_ERROR(LoadModelTensors(plan, files, options, report));
  PP_RETURN_IF_ERROR(LoadOptimizerStates(plan, files, optimizer, report));
  if (options.strict && has_optim_files && !report.optimizer_missing.empty()) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", report.dir,
                                            " has no optimizer state for ",
                                            absl::StrJoin(report.optimizer_missing, ", ")));
  }
  // Reported once, by rank 0.
  if (rank.rank == 0) ReportFilesBeyondModel(model, rank, report);
  if (options.strict && !report.unexpected.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", report.dir,
        " holds tensors the model does not have: ", absl::StrJoin(report.unexpected, ", ")));
  }
  PP_RETURN_IF_ERROR(LoadRankState(by_path, rank, report));
  return report;
}

}  // namespace pp
