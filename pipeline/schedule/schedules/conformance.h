// The conformance suite every registered schedule runs (testonly). Link the
// `conformance` target and the schedules to check into a cc_test with
// gtest_main: the suite is instantiated once per registered schedule name, so
// a new schedule gets the whole battery by being linked in:
//
//   pp_cc_test(name = "my_schedule_test", srcs = [...],
//              deps = [":my_schedule", "//pipeline/schedule/schedules:conformance",
//                      "//third_party:gtest_main"])
//
// For p in 1..8, m in 1..16, v in 1..3: the schedule either returns
// InvalidArgument (a combination it does not accept; the message must not be
// empty) or an order that validates, lowers, simulates without deadlock under
// both send models, and has the right action counts.
#ifndef PIPELINE_SCHEDULE_SCHEDULES_CONFORMANCE_H_
#define PIPELINE_SCHEDULE_SCHEDULES_CONFORMANCE_H_

#include <string>

#include "absl/status/status.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

// Runs every conformance check on one (schedule, options) pair; OK, or the
// first failure. Exposed so that tests can point it at a single combination.
absl::Status CheckScheduleConformance(const std::string& name, const ScheduleOptions& options);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_SCHEDULES_CONFORMANCE_H_
