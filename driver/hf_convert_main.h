// main() of hf_convert: pipe checkpoints <-> Hugging Face folders
// (config.json + model.safetensors; checkpoint/hf/README.md) for every model
// linked into the binary whose registration has a Hugging Face section
// (models/registry.h, ModelInfo::hf). It knows no model by name: a
// researcher's package builds its own hf_convert by linking this with its
// model's registration:
//
//   pp_cc_binary(name = "hf_convert", srcs = ["hf_convert.cc"],
//                deps = [":my_model_registration", "//driver:hf_convert_main"])
//   int main(int argc, char** argv) { return pp::HfConvertMain(argc, argv); }
//
// Commands:
//   hf_convert import [--model=M] --hf_dir=DIR --checkpoint=ROOT
//       the folder -> step 0 of a pipe checkpoint under ROOT, loadable at any
//       pp/dp layout. M is a registered model's name or a Hugging Face
//       model_type its registration declares ("llama", "gpt2"); without it,
//       the folder's config.json model_type picks the model. Prints the
//       fields the folder decides as a --set override, to fine-tune it:
//       train_llama --resume=ROOT --set=...
//   hf_convert export --checkpoint=DIR --hf_dir=OUT
//       a pipe checkpoint (a step directory or a root with `latest`) -> a
//       folder transformers loads; the model and its shape come from the run
//       config the checkpoint records.
// Errors name the models that convert each way.
#ifndef DRIVER_HF_CONVERT_MAIN_H_
#define DRIVER_HF_CONVERT_MAIN_H_

namespace pp {

// Parses the flags and runs the command. Returns the process exit code: 0,
// or 2 with "error: ..." on stderr.
int HfConvertMain(int argc, char** argv);

}  // namespace pp

#endif  // DRIVER_HF_CONVERT_MAIN_H_
