// Models by name. A model is one package ending in a registration: its name,
// its hyperparameters (a proto2 message extending pp.ModelConfig, defaults in
// the .proto), validation, layer specs, loss, data source and an optional
// sampler:
//
//   // my_model.proto: extend pp.ModelConfig { optional MyModelConfig my_model = 1000; }
//   PP_REGISTER_MODEL(MyModelConfig, my_model, {
//       .name = "my_model",
//       .description = "...",
//       .specs = [](const MyModelConfig& c) { ... },
//       .loss = MyLoss,
//       .tensor_parallel_loss = ...,  // optional: declares support for parallelism.tp > 1
//       .vocabulary_split = ...,      // optional: for parallelism.vocab_parallel
//       .data = [](const MyModelConfig& c, const ModelRun& run) { ... },
//       .hf = {...},                  // optional: Hugging Face import/export
//   });
//
// and a run's config selects it with `model { [pp.my_model] { ... } }`. The
// driver (driver/) looks the model up here and knows no model by name.
//
// Hugging Face conversion (`.hf`, an HfConversion) is part of the
// registration too, like a transformers model class's from_pretrained /
// save_pretrained or torchtitan's state_dict_adapter: the model's package
// keeps its converter (models/gpt/gpt_hf.h, models/llama/llama_hf.h; the
// folder and safetensors pieces are checkpoint/hf/), declares the
// config.json `model_type`s it reads, and hf_convert (driver/hf_convert_main.h)
// finds it by the pipe name or the model_type without knowing either:
//
//   .hf = {.model_types = {"my_hf_type"},
//          .import_folder = [](const std::string& hf_dir, const std::string& root)
//              -> absl::StatusOr<MyModelConfig> { ... },  // folder -> step 0 under root
//          .export_checkpoint = [](const std::string& checkpoint, const MyModelConfig& c,
//                                  const std::string& hf_dir) { ... }},  // -> folder
//
// Why proto2 extensions (not google.protobuf.Any): the config stays plain
// protobuf text with the model's fields and their defaults typed and
// checked by the parser (`[pp.gpt] { width: 256 }`), not Any's
// `[type.googleapis.com/pp.GptModelConfig]`; the model's message lives in the
// model's package, and linking the registration is all it takes for the
// parser to know it.
//
// Registering a name, an extension or a Hugging Face model_type twice aborts
// at start-up (static initialization) naming both. The registry is filled
// during static initialization and read-only afterwards, so lookups are
// thread-safe.
#ifndef MODELS_REGISTRY_H_
#define MODELS_REGISTRY_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "models/model_config.pb.h"
#include "models/model_memory.h"
#include "pipeline/layers/layer_context.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/layers/vocab_split.h"
#include "pipeline/runtime/micro_batch_source.h"
#include "pipeline/runtime/trainer.h"
#include "topology/parallel_grid.h"

namespace pp {

// What a model reads of the run it is trained in (the driver fills it from
// the run's config).
struct ModelRun {
  int64_t micro_batch_size = 1;
  int64_t num_microbatches = 1;
  int64_t dp = 1;
  int64_t pp = 1;                  // pipeline stages
  int64_t tp = 1;                  // tensor-parallel ranks per stage (parallelism.tp)
  bool sequence_parallel = false;  // parallelism.sequence_parallel
  int64_t chunks = 1;              // model parts per stage (pp x chunks parts in all)
  uint64_t seed = 0;
  // "corpus" (data_path), "synthetic" or "tokens" (pre-tokenized files at
  // data_path in data_format and data_dtype): the model's data_sources say
  // which it reads.
  std::string data_source = "corpus";
  std::string data_path;              // a text file or folder, or token files
  double eval_fraction = 0;           // the data's held-out tail
  std::string data_format = "flat";   // tokens: "flat" or "megatron"
  std::string data_dtype = "uint16";  // tokens, flat: "uint16" or "uint32"
  bool document_aware = false;        // tokens: windows inside one document
  // data.packing: "none", "documents" or "padded" (models/data/packed_data.h),
  // data.packing_balance "tokens" or "cost", data.eos_token (flat files).
  std::string packing = "none";
  std::string packing_balance = "tokens";
  int64_t eos_token = 0;
  std::string packing_order = "seed";  // data.packing_order: "seed" or "cost"
};

// A block per model part: a run cuts the model into pp x chunks parts (the
// embedding and the head ride along with the first and last blocks).
// InvalidArgument naming `num_blocks_field` (e.g. "gpt.num_layers") when the
// model has fewer than `num_blocks`.
absl::Status CheckBlocksPerPart(const ModelRun& run, int64_t num_blocks,
                                absl::string_view num_blocks_field);

// A model's data for one run. Every rank makes its own (the sources must be
// deterministic in (step, index); see micro_batch_source.h).
struct ModelData {
  std::unique_ptr<MicroBatchSource> train;
  std::unique_ptr<MicroBatchSource> eval;  // null: no evaluation
  int64_t tokens_per_step = 0;             // global (samples, for a non-token model)
  std::string description;                 // for the run's header line
  // Micro-batches whose index says their cost (data.packing_order "cost"):
  // the estimated costs of data-parallel rank `dp_rank`'s micro-batches of
  // `step`, in order (--schedule=auto synthesises for their profile). Null:
  // every index alike.
  std::function<std::vector<double>(int64_t step, int64_t dp_rank)> microbatch_costs;
};

// What the run asks of a sampler (ExperimentConfig's sample_* fields).
struct SampleRequest {
  int64_t num_tokens = 0;
  int64_t top_k = 1;
  double temperature = 1.0;
  uint64_t seed = 0;
  std::string prompt;
  // Every window the sampler runs must be a multiple of this long (the
  // tensor-parallel size under sequence parallelism): a causal model pads
  // the window's end, which leaves the logits before it unchanged.
  int64_t sequence_multiple = 1;
};

// Text generated through the trained pipeline at the end of a run. One per
// rank; it outlives the trainer.
class ModelSampler {
 public:
  virtual ~ModelSampler() = default;
  // The loss to train with (the sampler may keep the last stage's outputs).
  virtual LossFn WrapLoss(LossFn loss) = 0;
  // Collective over the pipeline: every rank calls it; rank 0's text counts.
  virtual absl::StatusOr<std::string> Sample(const SampleRequest& request, Trainer& trainer,
                                             ParallelGrid& grid,
                                             std::chrono::milliseconds timeout) = 0;
};

// A model's Hugging Face conversion: between a transformers-style folder
// (config.json + model.safetensors, checkpoint/hf/hf_folder.h) and a
// layer-wise pipe checkpoint, which loads at any pp/dp/tp layout. Either
// function may be null (the model converts one way only); hf_convert names
// the models that convert each way.
struct HfConversion {
  // The config.json `model_type`s import reads ("gpt2"); hf_convert accepts
  // them for --model beside the pipe name and picks the model from a folder's
  // config.json by them. A model_type belongs to one model (registering it
  // twice aborts at start-up).
  std::vector<std::string> model_types;
  // Reads the folder `hf_dir` and saves it as step 0 of a pipe checkpoint
  // under `root` (which must hold no checkpoint; hf_folder.h's
  // ImportHfToCheckpoint does both). Returns the model's config message (of
  // the registration's type) with the fields the folder decides set, and only
  // those: hf_convert prints them as the --set overrides a run resuming from
  // `root` needs. InvalidArgument naming the config.json field the model
  // cannot take.
  std::function<absl::StatusOr<std::unique_ptr<google::protobuf::Message>>(
      const std::string& hf_dir, const std::string& root)>
      import_folder;
  // Writes the pipe checkpoint `checkpoint` (a step directory) of a run of
  // this model with `config` (the config the checkpoint records) to the
  // folder `hf_dir`, created.
  std::function<absl::Status(const std::string& checkpoint, const google::protobuf::Message& config,
                             const std::string& hf_dir)>
      export_checkpoint;
};

// A registered model, its functions taking its own config message (the
// extension's value, every default filled in).
struct ModelInfo {
  std::string name;
  std::string description;   // one line, for --help and errors
  int extension_number = 0;  // of the config message's extension of pp.ModelConfig
  // The partition method used when the config names none (e.g. a block type).
  std::string default_partition_method = "uniform";
  // The data.source values `data` reads (checked before launch).
  std::vector<std::string> data_sources = {"corpus"};
  // Its fields and the run's shape (e.g. a block per model part); may be null.
  std::function<absl::Status(const google::protobuf::Message&, const ModelRun&)> validate;
  std::function<absl::StatusOr<std::vector<LayerSpec>>(const google::protobuf::Message&)> specs;
  LossFn loss;
  // Tensor parallelism (parallelism.tp > 1): the loss of this rank's share of
  // the last layer's outputs (GPT: vocabulary-parallel cross-entropy of its
  // slice of the logits). Setting it declares that the model supports tp > 1:
  // its layer factories build their shards from LayerContext::model_parallel
  // (pipeline/layers/layer_context.h) and `validate` refuses a ModelRun::tp
  // its sizes cannot split. Null: the driver refuses tp > 1 before launch.
  std::function<LossFn(const google::protobuf::Message&, const ModelParallelGroup&)>
      tensor_parallel_loss;
  // Vocabulary parallelism (parallelism.vocab_parallel): the model without
  // its token table and head, and where those come from
  // (pipeline/layers/vocab_split.h). Setting it declares that the model
  // supports it; its loss is then the vocabulary passes' cross-entropy over
  // the micro-batch's "labels". Null: the driver refuses vocab_parallel.
  std::function<absl::StatusOr<VocabularySplit>(const google::protobuf::Message&)> vocabulary_split;
  // InvalidArgument for a data source the model cannot read (naming it).
  std::function<absl::StatusOr<ModelData>(const google::protobuf::Message&, const ModelRun&)> data;
  // Optional: checks the run's data files against the model (e.g. every token
  // id below the vocabulary) before any worker starts. The driver's preflight
  // calls it, not config validation, so a config whose data is made later
  // still validates.
  std::function<absl::Status(const google::protobuf::Message&, const ModelRun&)> check_data;
  // Optional: null for a model without sampling.
  std::function<std::unique_ptr<ModelSampler>(const google::protobuf::Message&)> sampler;
  // Optional: the model's memory arithmetic (models/model_memory.h;
  // TransformerMemory for a transformer), for the driver's fit estimate before
  // launch, the per-rank byte planner and parallelism.memory_cap_mib. Null: no
  // estimate (the run says so) and no memory cap.
  std::function<ModelMemory(const google::protobuf::Message&)> memory;
  // Optional: Hugging Face import and export (HfConversion above).
  HfConversion hf;
};

// Adds a model; aborts if its name, extension number or one of its
// hf.model_types is taken, or its name is empty.
// Use PP_REGISTER_MODEL.
void RegisterModel(ModelInfo info);

// Registered models, sorted by name.
std::vector<const ModelInfo*> RegisteredModels();
std::vector<std::string> RegisteredModelNames();
// Null when no model of that name (or extension number) is linked in.
const ModelInfo* FindModel(const std::string& name);
const ModelInfo* FindModelByExtension(int extension_number);
// The model whose HfConversion declares `model_type`; null when none.
const ModelInfo* FindModelByHfType(const std::string& model_type);

// The model a config's `model` section selects and its message: exactly one
// extension set. InvalidArgument names what is set and the registered models.
struct SelectedModel {
  const ModelInfo* info = nullptr;
  const google::protobuf::FieldDescriptor* extension = nullptr;
  const google::protobuf::Message* config = nullptr;  // the extension's value, in `config`
};
absl::StatusOr<SelectedModel> SelectModel(const ModelConfig& config);
// The extension of a registered model (for overrides: "gpt.width=256").
const google::protobuf::FieldDescriptor* ModelExtension(const ModelInfo& model);

namespace internal_model {

template <typename Config>
const Config& As(const google::protobuf::Message& message) {
  return static_cast<const Config&>(message);
}

// HfConversion taking the model's own config message.
template <typename Config>
struct TypedHfConversion {
  std::vector<std::string> model_types;
  std::function<absl::StatusOr<Config>(const std::string& hf_dir, const std::string& root)>
      import_folder;
  std::function<absl::Status(const std::string& checkpoint, const Config& config,
                             const std::string& hf_dir)>
      export_checkpoint;
};

// The typed form PP_REGISTER_MODEL takes.
template <typename Config>
struct TypedModel {
  std::string name;
  std::string description;
  std::string default_partition_method = "uniform";
  std::vector<std::string> data_sources = {"corpus"};
  std::function<absl::Status(const Config&, const ModelRun&)> validate;
  std::function<absl::StatusOr<std::vector<LayerSpec>>(const Config&)> specs;
  LossFn loss;
  std::function<LossFn(const Config&, const ModelParallelGroup&)> tensor_parallel_loss;
  std::function<absl::StatusOr<VocabularySplit>(const Config&)> vocabulary_split;
  std::function<absl::StatusOr<ModelData>(const Config&, const ModelRun&)> data;
  std::function<absl::Status(const Config&, const ModelRun&)> check_data;
  std::function<std::unique_ptr<ModelSampler>(const Config&)> sampler;
  std::function<ModelMemory(const Config&)> memory;
  TypedHfConversion<Config> hf;
};

template <typename Config>
ModelInfo Erase(TypedModel<Config> m, int extension_number) {
  using Msg = google::protobuf::Message;
  ModelInfo info;
  info.name = std::move(m.name);
  info.description = std::move(m.description);
  info.extension_number = extension_number;
  info.default_partition_method = std::move(m.default_partition_method);
  info.data_sources = std::move(m.data_sources);
  if (m.validate) {
    info.validate = [f = m.validate](const Msg& c, const ModelRun& run) {
      return f(As<Config>(c), run);
    };
  }
  if (m.specs) info.specs = [f = m.specs](const Msg& c) { return f(As<Config>(c)); };
  info.loss = std::move(m.loss);
  if (m.tensor_parallel_loss) {
    info.tensor_parallel_loss = [f = m.tensor_parallel_loss](const Msg& c,
                                                             const ModelParallelGroup& group) {
      return f(As<Config>(c), group);
    };
  }
  if (m.vocabulary_split) {
    info.vocabulary_split = [f = m.vocabulary_split](const Msg& c) { return f(As<Config>(c)); };
  }
  if (m.data) {
    info.data = [f = m.data](const Msg& c, const ModelRun& run) { return f(As<Config>(c), run); };
  }
  if (m.check_data) {
    info.check_data = [f = m.check_data](const Msg& c, const ModelRun& run) {
      return f(As<Config>(c), run);
    };
  }
  if (m.sampler) info.sampler = [f = m.sampler](const Msg& c) { return f(As<Config>(c)); };
  if (m.memory) info.memory = [f = m.memory](const Msg& c) { return f(As<Config>(c)); };
  info.hf.model_types = std::move(m.hf.model_types);
  if (m.hf.import_folder) {
    info.hf.import_folder = [f = m.hf.import_folder](
                                const std::string& hf_dir,
                                const std::string& root) -> absl::StatusOr<std::unique_ptr<Msg>> {
      absl::StatusOr<Config> config = f(hf_dir, root);
      if (!config.ok()) return config.status();
      return std::make_unique<Config>(*std::move(config));
    };
  }
  if (m.hf.export_checkpoint) {
    info.hf.export_checkpoint = [f = m.hf.export_checkpoint](const std::string& checkpoint,
                                                             const Msg& c,
                                                             const std::string& hf_dir) {
      return f(checkpoint, As<Config>(c), hf_dir);
    };
  }
  return info;
}

struct ModelRegistrar {
  explicit ModelRegistrar(ModelInfo info) { RegisterModel(std::move(info)); }
};

}  // namespace internal_model

#define PP_MODEL_CONCAT_INNER_(a, b) a##b
#define PP_MODEL_CONCAT_(a, b) PP_MODEL_CONCAT_INNER_(a, b)

// PP_REGISTER_MODEL(ConfigMessage, extension, {.name = ..., ...}): `extension`
// is the generated extension identifier (pp::gpt for `extend ModelConfig {
// optional GptModelConfig gpt = 100; }`); the braces a TypedModel<ConfigMessage>.
#define PP_REGISTER_MODEL(Config, extension, ...)                            \
  static ::pp::internal_model::ModelRegistrar PP_MODEL_CONCAT_(              \
      pp_model_registrar_, __COUNTER__)(::pp::internal_model::Erase<Config>( \
      ::pp::internal_model::TypedModel<Config> __VA_ARGS__, (extension).number()))

}  // namespace pp

#endif  // MODELS_REGISTRY_H_
