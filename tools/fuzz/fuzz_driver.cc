// A bounded, deterministic stand-in for libFuzzer's main, so every fuzz target
// (a LLVMFuzzerTestOneInput) runs as an ordinary test with the default
// toolchain: each file of the seed corpus, then mutations of them (bit flips,
// byte insertions, deletions, duplications, splices of two inputs, interesting
// bytes) from a fixed seed, until --runs inputs or --seconds have passed.
// A crash, a sanitizer report or an abort fails the test; the input that did
// it is written to $TEST_UNDECLARED_OUTPUTS_DIR (or the working directory) as
// crash-<n> and its path printed, to be added to the corpus and a unit test.
//
// Under --config=fuzz the same target links libFuzzer's own main instead
// (tools/fuzz/fuzz.bzl) for open-ended, coverage-guided fuzzing.
//
//   fuzz_driver CORPUS_DIR... [--runs=N] [--seconds=S] [--seed=K]
#include <dirent.h>
#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> g_current;  // the input being run (for the crash dump)

void ListFiles(const std::string& path, std::vector<std::string>& out) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return;
  if (S_ISREG(st.st_mode)) {
    out.push_back(path);
    return;
  }
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    ListFiles(path + "/" + e->d_name, out);
  }
  ::closedir(dir);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Mutate(const std::vector<std::string>& pool, std::mt19937_64& rng) {
  std::string s = pool[rng() % pool.size()];
  const int edits = 1 + static_cast<int>(rng() % 4);
  static const char* kInteresting[] = {
      "0",   "-1", "1e400", "nan", "inf", "\"", "{",
      "}",   ":",  "\n",    "\\",  "=",   ",",  "99999999999999999999",
      "\xff"};
  for (int e = 0; e < edits; ++e) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 6) {
      case 0:  // flip a bit
        if (!s.empty()) s[pos % s.size()] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // insert a random byte
        s.insert(pos, 1, static_cast<char>(rng() % 256));
        break;
      case 2:  // delete a run
        if (!s.empty()) s.erase(pos % s.size(), 1 + rng() % 16);
        break;
      case 3: {  // duplicate a run
        if (s.empty()) break;
        const size_t from = rng() % s.size();
        s.insert(pos, s.substr(from, 1 + rng() % 32));
        break;
      }
      case 4: {  // splice with another input
        const std::string& other = pool[rng() % pool.size()];
        if (other.empty()) break;
        s = s.substr(0, pos) + other.substr(rng() % other.size());
        break;
      }
      default:  // an interesting token
        s.insert(pos, kInteresting[rng() % (sizeof(kInteresting) / sizeof(*kInteresting))]);
        break;
    }
  }
  if (s.size() > 65536) s.resize(65536);
  return s;
}

void DumpOnCrash(int signo) {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string path = std::string(dir != nullptr ? dir : ".") + "/crash-input";
  if (!g_current.empty()) {
    if (FILE* f = std::fopen(path.c_str(), "wb")) {
      std::fwrite(g_current[0].data(), 1, g_current[0].size(), f);
      std::fclose(f);
      std::fprintf(stderr, "fuzz_driver: signal %d; the input is in %s\n", signo, path.c_str());
    }
  }
  std::signal(signo, SIG_DFL);
  std::raise(signo);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t runs = 20000;
  double seconds = 30;
  uint64_t seed = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--runs=", 0) == 0) {
      runs = std::atoll(arg.c_str() + 7);
    } else if (arg.rfind("--seconds=", 0) == 0) {
      seconds = std::atof(arg.c_str() + 10);
    } else if (arg.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(arg.c_str() + 7, nullptr, 10);
    } else {
      ListFiles(arg, files);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "fuzz_driver: no seed corpus files in the arguments\n");
    return 2;
  }
  for (int signo : {SIGSEGV, SIGABRT, SIGFPE, SIGBUS, SIGILL}) std::signal(signo, DumpOnCrash);
  std::vector<std::string> pool;
  g_current.resize(1);
  for (const std::string& f : files) {
    pool.push_back(Slurp(f));
    g_current[0] = pool.back();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(pool.back().data()),
                           pool.back().size());
  }
  std::mt19937_64 rng(seed);
  const auto start = std::chrono::steady_clock::now();
  int64_t done = 0;
  for (; done < runs; ++done) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) {
      break;
    }
    g_current[0] = Mutate(pool, rng);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(g_current[0].data()),
                           g_current[0].size());
  }
  std::printf("fuzz_driver: %zu corpus file(s) and %lld mutated input(s) ran clean (seed %llu)\n",
              files.size(), static_cast<long long>(done), static_cast<unsigned long long>(seed));
  return 0;
}
