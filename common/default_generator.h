// LibTorch's default CPU generator is one per process. Code that replaces its
// state for a while (seed -> build a layer -> restore; activation
// checkpointing's save/restore around a recompute) must not interleave with
// another thread doing the same, or one thread's restore lands in the middle of
// the other's seeded sequence. Ranks run as threads of one process (tests, the
// thread launcher) hit exactly that: a recompute's restore in rank 1 landed
// inside rank 0's seeded layer build, and the data-parallel replicas started
// from different weights. Every such sequence holds this one lock.
#ifndef COMMON_DEFAULT_GENERATOR_H_
#define COMMON_DEFAULT_GENERATOR_H_

#include <mutex>

namespace pp {

// Recursive: a seeded layer factory may build seeded sub-layers.
std::recursive_mutex& DefaultGeneratorMutex();

}  // namespace pp

#endif  // COMMON_DEFAULT_GENERATOR_H_
