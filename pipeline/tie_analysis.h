// Tie analysis: find the parameters of an ordinary LibTorch module that are
// shared (one tensor registered in several places) and turn a
// torch::nn::Sequential into LayerSpecs whose shared parameters become tie
// groups. The analysis must run on the original module, before any copy
// (clone, load, move to a device by copy) gives each user its own tensor:
// afterwards the sharing can no longer be seen (Slapo's tie analysis).
//
//   torch::nn::Sequential seq(embedding, block, head);  // head reuses embedding->weight
//   ASSIGN_OR_RETURN(std::vector<pp::LayerSpec> specs, pp::SpecsFromSequential(seq));
#ifndef PIPELINE_TIE_ANALYSIS_H_
#define PIPELINE_TIE_ANALYSIS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/layers/layer_spec.h"

namespace pp {

// Groups of names from module.named_parameters() that refer to the same
// parameter (same storage, offset, sizes and strides), each group in
// registration order, groups ordered by their first name. Only groups of two
// or more names are returned.
std::vector<std::vector<std::string>> FindTiedParameters(const torch::nn::Module& module);

// One spec per child of `seq` (each a module of one tensor). Children that
// share parameters, directly or through a chain, form one tie key
// "shared_<i>" (i = the first child of the group); every position of the
// group is a TiedLayerSpec running its own child, and the shared module holds
// the group's children with each shared tensor registered once, under the
// first child's name ("tied.shared_0.0.weight"). All parameters of a tie
// group's children are tied.
// The specs hand out the original modules (no copy, so the sharing survives):
// use them for one PipelineModel or one BuildSequential per process; the
// declared parameter counts avoid building anything for partitioning.
// InvalidArgument for an empty Sequential.
absl::StatusOr<std::vector<LayerSpec>> SpecsFromSequential(torch::nn::Sequential seq);

}  // namespace pp

#endif  // PIPELINE_TIE_ANALYSIS_H_
