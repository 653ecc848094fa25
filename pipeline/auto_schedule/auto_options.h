// What a run's config says about `parallelism.schedule: "auto"`, checkable
// before any worker starts and without LibTorch: the schedule it measures
// under, and costs given instead of measured (parallelism.auto_costs).
// Config validation links this, not the auto-scheduler (auto_schedule.h).
#ifndef PIPELINE_AUTO_SCHEDULE_AUTO_OPTIONS_H_
#define PIPELINE_AUTO_SCHEDULE_AUTO_OPTIONS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/schedule/analysis/simulator.h"

namespace pp {

inline constexpr absl::string_view kAutoSchedule = "auto";
// The file a synthesised schedule is saved as (run and checkpoint directory).
inline constexpr absl::string_view kAutoScheduleFile = "auto_schedule.csv";

// The registered schedule an auto run starts and measures with; InvalidArgument
// naming the valid chunk counts for any other.
absl::StatusOr<std::string> AutoMeasurementSchedule(int chunks);

// The schedule to build a run's model and Trainer with: `schedule` itself, or
// for "auto" its measurement schedule.
absl::StatusOr<std::string> StartingSchedule(const std::string& schedule, int chunks);

// parallelism.auto_costs: costs given instead of measured (reproducible, or
// another machine's). `text` is the simulator's cost string
// (ParseSimulationCosts: "F:1,I:1,W:1,comm:0.1"), the costs of one
// micro-batch through one pipeline rank's share of the model; with v chunks
// each virtual stage costs 1/v of it. A missing I/W splits B in halves, as a
// measured unsplit backward. InvalidArgument names the field and the bad part.
absl::StatusOr<SimulationCosts> AutoFixedCosts(absl::string_view text, int num_stages,
                                               int num_chunks);

}  // namespace pp

#endif  // PIPELINE_AUTO_SCHEDULE_AUTO_OPTIONS_H_
