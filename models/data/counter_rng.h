// A counter-based random stream for data sampling.
//
// Every sample is drawn from a generator seeded by (seed, step, index), so the
// data of any step can be produced without replaying earlier ones (exact
// resumption needs only the step) and the result does not depend on how many
// data-parallel ranks share the step. SplitMix64 is fully specified, unlike
// std::uniform_int_distribution, so samples are identical on every platform.
#ifndef MODELS_DATA_COUNTER_RNG_H_
#define MODELS_DATA_COUNTER_RNG_H_

#include <cstdint>

namespace pp {
namespace internal_data {

// Not thread-safe; cheap to copy.
class CounterRng {
 public:
  CounterRng(uint64_t seed, uint64_t step, uint64_t index)
      : state_(Mix(Mix(Mix(seed) ^ step) ^ (index + 0x632BE59BD9B4E019ULL))) {}

  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    return Mix(state_);
  }
  // Uniform in [0, n); n > 0. The modulo bias is below 2^-40 for the sizes used.
  uint64_t Below(uint64_t n) { return Next() % n; }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  static uint64_t Mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

}  // namespace internal_data
}  // namespace pp

#endif  // MODELS_DATA_COUNTER_RNG_H_
