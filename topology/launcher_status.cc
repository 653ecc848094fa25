#include "topology/launcher_status.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pp {
namespace {

constexpr uint64_t kMagic = 0x3174617473707070;  // "pppstat1"
constexpr size_t kActionBytes = 256;

// The page's layout. The writer fills the slot the sequence number does not
// point at, then publishes it by incrementing the number, so a reader (which
// looks only once the writer is dead or stopped) never sees a half-written
// name: at worst the previous one.
struct Record {
  uint64_t magic;
  int32_t stage;
  int32_t data_index;
  int64_t step;
  uint32_t action_seq;
  char action[2][kActionBytes];
};
static_assert(sizeof(Record) <= 4096, "one page");

Record* MappedRecord() {
  static Record* record = [] {
    const char* raw = std::getenv(kWorkerStatusFdVariable);
    int fd = -1;
    if (raw == nullptr || !absl::SimpleAtoi(raw, &fd) || fd < 0)
      return static_cast<Record*>(nullptr);
    void* page = ::mmap(nullptr, sizeof(Record), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);  // the mapping keeps the memory
    if (page == MAP_FAILED) return static_cast<Record*>(nullptr);
    auto* r = static_cast<Record*>(page);
    if (r->magic != kMagic) return static_cast<Record*>(nullptr);
    return r;
  }();
  return record;
}

std::mutex& WriterMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

}  // namespace

bool WorkerStatusEnabled() { return MappedRecord() != nullptr; }

void ReportWorkerPlace(int stage, int data_index) {
  Record* r = MappedRecord();
  if (r == nullptr) return;
  std::lock_guard<std::mutex> lock(WriterMutex());
  __atomic_store_n(&r->stage, stage, __ATOMIC_RELEASE);
  __atomic_store_n(&r->data_index, data_index, __ATOMIC_RELEASE);
}

void ReportWorkerAction(absl::string_view action) {
  Record* r = MappedRecord();
  if (r == nullptr) return;
  std::lock_guard<std::mutex> lock(WriterMutex());
  const uint32_t next = r->action_seq + 1;
  char* slot = r->action[next & 1];
  const size_t n = std::min(action.size(), kActionBytes - 1);
  std::memcpy(slot, action.data(), n);
  slot[n] = '\0';
  __atomic_store_n(&r->action_seq, next, __ATOMIC_RELEASE);
}

void ReportWorkerStep(int64_t step) {
  Record* r = MappedRecord();
  if (r == nullptr) return;
  __atomic_store_n(&r->step, step, __ATOMIC_RELEASE);
}

absl::StatusOr<std::unique_ptr<WorkerStatusPage>> WorkerStatusPage::Create() {
  const int fd = ::memfd_create("pp-worker-status", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  if (::ftruncate(fd, sizeof(Record)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("ftruncate of the status page: ", std::strerror(err)));
  }
  void* page = ::mmap(nullptr, sizeof(Record), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (page == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("mmap of the status page: ", std::strerror(err)));
  }
  auto* r = static_cast<Record*>(page);
  r->stage = -1;
  r->data_index = -1;
  r->step = -1;
  r->action_seq = 0;
  r->magic = kMagic;
  return std::unique_ptr<WorkerStatusPage>(new WorkerStatusPage(fd, page));
}

WorkerStatusPage::~WorkerStatusPage() {
  ::munmap(page_, sizeof(Record));
  ::close(fd_);
}

WorkerStatusPage::Snapshot WorkerStatusPage::Read() const {
  const auto* r = static_cast<const Record*>(page_);
  Snapshot s;
  s.stage = __atomic_load_n(&r->stage, __ATOMIC_ACQUIRE);
  s.data_index = __atomic_load_n(&r->data_index, __ATOMIC_ACQUIRE);
  s.step = __atomic_load_n(&r->step, __ATOMIC_ACQUIRE);
  const uint32_t seq = __atomic_load_n(&r->action_seq, __ATOMIC_ACQUIRE);
  if (seq != 0) {
    const char* slot = r->action[seq & 1];
    s.action.assign(slot, strnlen(slot, kActionBytes));
  }
  return s;
}

std::string WorkerStatusPage::Describe(const Snapshot& s) {
  std::string out;
  if (s.stage >= 0) absl::StrAppend(&out, "pipeline stage ", s.stage);
  if (s.data_index >= 0) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", "data-parallel index ", s.data_index);
  }
  if (!s.action.empty()) absl::StrAppend(&out, out.empty() ? "" : "; ", "last action ", s.action);
  return out;
}

}  // namespace pp
