// Small file helpers shared by the checkpoint/model tests.
#ifndef CHECKPOINT_MODEL_TEST_FILES_H_
#define CHECKPOINT_MODEL_TEST_FILES_H_

#include <string>

namespace pp::checkpoint::test_files {

// An empty directory `name` under $TEST_TMPDIR (or /tmp), removed first if present.
std::string FreshDir(const std::string& name);

// The whole file at `path` as bytes ("" if it cannot be read).
std::string Slurp(const std::string& path);

// Replaces the file at `path` with `data`.
void Spit(const std::string& path, const std::string& data);

}  // namespace pp::checkpoint::test_files

#endif  // CHECKPOINT_MODEL_TEST_FILES_H_
