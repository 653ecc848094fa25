#include "common/default_generator.h"

namespace pp {

std::recursive_mutex& DefaultGeneratorMutex() {
  // Leaked: usable from static destructors and threads outliving main.
  static std::recursive_mutex* mu = new std::recursive_mutex();
  return *mu;
}

}  // namespace pp
