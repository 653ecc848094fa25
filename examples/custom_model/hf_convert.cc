// bazel run //examples/custom_model:hf_convert -- export --checkpoint=DIR --hf_dir=OUT
// pipe's hf_convert (driver/hf_convert_main.h) linked with this package's
// registration: the tied autoencoder exports to a Hugging Face-style folder
// and imports back (tied_autoencoder_hf.h), with no edit outside this package.
#include "driver/hf_convert_main.h"

int main(int argc, char** argv) { return pp::HfConvertMain(argc, argv); }
