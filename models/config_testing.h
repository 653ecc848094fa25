// A model's hyperparameter message (gpt_config.proto, bert_config.proto,
// llama_config.proto) written in text format, as a run's config writes it:
//
//   const GptModelConfig tiny = ParseModelConfig<GptModelConfig>(
//       "vocab_size: 64 context_length: 16 width: 32 num_heads: 2");
//
// Fields a test leaves out keep the message's defaults. Test-only.
#ifndef MODELS_CONFIG_TESTING_H_
#define MODELS_CONFIG_TESTING_H_

#include <string>

#include <glog/logging.h>
#include <google/protobuf/text_format.h>

namespace pp {

// CHECK-fails on text that does not parse (a typo in the test).
template <typename Config>
Config ParseModelConfig(const std::string& text) {
  Config config;
  CHECK(google::protobuf::TextFormat::ParseFromString(text, &config))
      << "not a " << Config::descriptor()->full_name() << ": " << text;
  return config;
}

}  // namespace pp

#endif  // MODELS_CONFIG_TESTING_H_
