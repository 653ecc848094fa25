// The text the models' equivalence tests train on: short, repetitive, with
// letters, digits and punctuation (so a vocabulary split over ranks puts
// its tokens on several of them).
#ifndef MODELS_EQUIVALENCE_SUITE_TEXT_H_
#define MODELS_EQUIVALENCE_SUITE_TEXT_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace pp {

inline std::string EquivalenceSuiteText() {
  std::string text;
  for (int i = 0; i < 60; ++i) {
    text += absl::StrCat("Stage ", i % 7, " sends activations to stage ", (i + 1) % 7,
                         ". Bubbles waste time! ");
  }
  return text;
}

}  // namespace pp

#endif  // MODELS_EQUIVALENCE_SUITE_TEXT_H_
