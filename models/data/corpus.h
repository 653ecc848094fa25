// Loading a text corpus from a file or a directory tree.
//
// The default corpus is /usr/share/common-licenses: the licence texts (GPL,
// LGPL, Apache, MPL, GFDL, Artistic, ...) that Debian's base-files package
// installs. base-files is Essential, so the folder exists on every Debian 12
// machine, including minimal container images that strip /usr/share/doc; it
// holds ~240 KB of English prose, plenty for the small models pipe's
// experiments train on 2 cores. Any other text file or folder works via --data.
#ifndef MODELS_DATA_CORPUS_H_
#define MODELS_DATA_CORPUS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pp {

inline constexpr char kDefaultCorpusPath[] = "/usr/share/common-licenses";

// The regular files under a folder as LoadCorpus reads them.
struct CorpusListing {
  // Sorted. A file linked under two names is listed under both (LoadCorpus
  // reads it once).
  std::vector<std::string> files;
  // Folders reached a second time through a link (e.g. `ln -s . d/loop`),
  // not entered again: following them would walk forever.
  int64_t repeated_folders = 0;
};

// Lists the regular files under `dir` (recursing, following links to
// folders, each folder entered once by device and inode; unreadable folders
// skipped). FIFOs, sockets and devices are not listed (a reader could block
// on them). InvalidArgument naming `dir` when it holds more than
// `max_entries` entries in all (a runaway tree is refused instead of walked).
absl::StatusOr<CorpusListing> ListCorpusFiles(const std::string& dir,
                                              int64_t max_entries = 1000000);

struct Corpus {
  // The files read, in the order their text was concatenated.
  std::vector<std::string> files;
  // Their contents, each followed by a blank line.
  std::string text;
};

// Reads `path`: a regular file, or a directory whose regular files (recursing,
// following links; ListCorpusFiles) are read in sorted path order. Files
// reached twice through links are read once; files that look binary (a NUL byte in the first 4 KB)
// are skipped. Errors: NotFound when `path` does not exist, InvalidArgument
// when nothing readable (or only empty text) is found.
absl::StatusOr<Corpus> LoadCorpus(const std::string& path);

// The paragraphs of a text: the runs of lines between blank lines (each with
// its line ends; blank lines dropped). The documents a packed corpus run
// trains on (models/data/packed_data.h).
std::vector<std::string> SplitParagraphs(const std::string& text);

// Splits token ids into a training part and a held-out tail of
// `eval_fraction` (in [0, 1)) of the ids; the tail is empty when
// eval_fraction is 0.
std::pair<std::vector<int64_t>, std::vector<int64_t>> SplitTrainEval(std::vector<int64_t> ids,
                                                                     double eval_fraction);

}  // namespace pp

#endif  // MODELS_DATA_CORPUS_H_
