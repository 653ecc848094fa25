// hf_convert: pipe checkpoints <-> Hugging Face folders for the reference
// models (driver/hf_convert_main.h; checkpoint/hf/README.md).
//
//   hf_convert import [--model=llama|gpt2] --hf_dir=DIR --checkpoint=ROOT
//   hf_convert export --checkpoint=DIR --hf_dir=OUT
//
// The converters are the models' own (models/gpt/gpt_hf.h,
// models/llama/llama_hf.h), reached through the registrations linked here.
#include "driver/hf_convert_main.h"

int main(int argc, char** argv) { return pp::HfConvertMain(argc, argv); }
