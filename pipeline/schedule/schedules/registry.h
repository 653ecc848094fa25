// Schedules by name. A schedule is one function from ScheduleOptions to a
// Schedule, registered in its own .cc (an alwayslink target):
//
//   absl::StatusOr<Schedule> MakeEager1F1B(const ScheduleOptions& options) {...}
//   PP_REGISTER_SCHEDULE("eager_1f1b", "1F1B with one extra warm-up forward",
//                        MakeEager1F1B);
//
// Registering a name twice aborts at start-up (static initialization) with
// the name and both descriptions in the message. Options a schedule does not support (e.g.
// num_chunks > 1 for gpipe, or interleaving's group rule) are InvalidArgument
// from its function, never a crash. The registry is filled during static
// initialization and read-only afterwards, so lookups are thread-safe.
#ifndef PIPELINE_SCHEDULE_SCHEDULES_REGISTRY_H_
#define PIPELINE_SCHEDULE_SCHEDULES_REGISTRY_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

using ScheduleFunction = std::function<absl::StatusOr<Schedule>(const ScheduleOptions&)>;

struct ScheduleInfo {
  std::string name;
  std::string description;  // one line, for --list and --help
  ScheduleFunction function;
};

// Adds a schedule; aborts if `name` is taken or empty. Use PP_REGISTER_SCHEDULE.
void RegisterSchedule(ScheduleInfo info);

// Makes the named schedule. NotFound lists the registered names.
// "csv:PATH" reads a schedule file instead (csv.h: either CSV form, placement
// from its "# stage_to_rank:" line, else looped), which must have exactly
// p rows, micro-batches 0..m-1 and v chunks per rank (InvalidArgument naming
// both shapes otherwise). The result
// has `name` set to the registered name and has passed a shape check (one list
// per rank, placement of size p * v); semantic checks live in the validator.
absl::StatusOr<Schedule> MakeSchedule(absl::string_view name, const ScheduleOptions& options);

// Registered schedules, sorted by name.
std::vector<ScheduleInfo> RegisteredSchedules();
std::vector<std::string> RegisteredScheduleNames();

namespace internal_schedule {
struct ScheduleRegistrar {
  ScheduleRegistrar(const char* name, const char* description, ScheduleFunction function);
};
}  // namespace internal_schedule

#define PP_SCHEDULE_CONCAT_INNER_(a, b) a##b
#define PP_SCHEDULE_CONCAT_(a, b) PP_SCHEDULE_CONCAT_INNER_(a, b)
// PP_REGISTER_SCHEDULE("name", "one-line description", function);
#define PP_REGISTER_SCHEDULE(name, description, function)                \
  static ::pp::internal_schedule::ScheduleRegistrar PP_SCHEDULE_CONCAT_( \
      pp_schedule_registrar_, __COUNTER__)(name, description, function)

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_SCHEDULES_REGISTRY_H_
