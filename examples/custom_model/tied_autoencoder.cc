#include "examples/custom_model/tied_autoencoder.h"

#include <memory>

namespace custom_model {
namespace {

class ResidualBlockImpl : public pp::LayerImpl {
 public:
  ResidualBlockImpl() : pp::LayerImpl("ResidualBlock") {
    linear_ = register_module("linear", torch::nn::Linear(kCode, kCode));
  }
  pp::Activations Forward(const pp::Activations& in, const pp::MicroBatch&) override {
    return {in[0] + torch::tanh(linear_(in[0]))};
  }

 private:
  torch::nn::Linear linear_{nullptr};
};

pp::Layer MakeEncoder(const pp::LayerContext&) {
  return pp::MakeModuleLayer(
      torch::nn::Linear(torch::nn::LinearOptions(kFeatures, kCode).bias(false)), "Encoder");
}

// The decoder position runs the shared encoder's weight the other way:
// h [., kCode] @ W [kCode, kFeatures].
pp::Activations Decode(pp::LayerImpl& shared, const pp::Activations& in, const pp::MicroBatch&) {
  auto params = shared.named_parameters();
  const torch::Tensor* weight = params.find("weight");
  TORCH_CHECK(weight != nullptr, "decoder: the shared encoder has no 'weight'");
  return {torch::matmul(in[0], *weight)};
}

}  // namespace

std::vector<pp::LayerSpec> TiedAutoencoderSpecs(int blocks) {
  std::vector<pp::LayerSpec> specs;
  specs.push_back(pp::TiedLayerSpec("code", MakeEncoder).WithName("Encoder"));
  for (int i = 0; i < blocks; ++i) {
    specs.push_back(pp::LayerSpec("ResidualBlock", [](const pp::LayerContext&) {
      return std::make_shared<ResidualBlockImpl>();
    }));
  }
  specs.push_back(pp::TiedLayerSpec("code", MakeEncoder, Decode).WithName("Decoder"));
  return specs;
}

torch::Tensor ReconstructionLoss(const pp::Activations& outputs, const pp::MicroBatch& batch) {
  return torch::mse_loss(outputs[0], batch.Get("target"));
}

LowRankSource::LowRankSource(int64_t rows, uint64_t seed, uint64_t stream)
    : rows_(rows), seed_(seed), stream_(stream) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  basis_ = torch::randn({kCode, kFeatures}, gen);
}

absl::StatusOr<pp::MicroBatchData> LowRankSource::Get(int64_t step, int64_t index) {
  if (step < 0 || index < 0) {
    return absl::InvalidArgumentError("LowRankSource: step and index must be >= 0");
  }
  torch::Generator gen = at::detail::createCPUGenerator(
      seed_ + 104729 * (stream_ + 1) + static_cast<uint64_t>(1000003 * step + 7919 * index));
  const torch::Tensor z = torch::randn({rows_, kCode}, gen);
  const torch::Tensor x = torch::matmul(z, basis_) + 0.01 * torch::randn({rows_, kFeatures}, gen);
  pp::MicroBatchData d;
  d.inputs = {x};
  d.batch.id = step * 100000 + index;
  d.batch.tensors["target"] = x;
  return d;
}

}  // namespace custom_model
