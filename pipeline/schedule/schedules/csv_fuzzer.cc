// Fuzz target: the schedule CSV reader (csv.h). The input is a file's text.
// Every input must give a Status, never a crash; a schedule that loads must
// write and read back to itself in both forms, and lower to the same program.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "pipeline/schedule/formats/csv.h"
#include "pipeline/schedule/ir/lowering.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The validator is quadratic in the cells at worst; big inputs add nothing.
  if (size > 4096) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pp::Schedule> schedule = pp::ParseCsvSchedule(text);
  if (!schedule.ok()) {
    if (schedule.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  absl::StatusOr<pp::LoweredProgram> program = pp::Lower(*schedule);
  if (!program.ok()) std::abort();  // a loaded schedule has been validated
  absl::StatusOr<pp::Schedule> compute = pp::ParseCsvSchedule(pp::ScheduleToCsv(*schedule));
  if (!compute.ok() || compute->ranks != schedule->ranks ||
      compute->stage_to_rank != schedule->stage_to_rank ||
      compute->num_microbatches != schedule->num_microbatches ||
      compute->forward_only != schedule->forward_only) {
    std::abort();
  }
  absl::StatusOr<pp::Schedule> comms = pp::ParseCsvSchedule(pp::ProgramToCsv(*program));
  if (!comms.ok() || comms->ranks != schedule->ranks) std::abort();
  absl::StatusOr<pp::LoweredProgram> again = pp::Lower(*comms);
  if (!again.ok() || again->ranks != program->ranks) std::abort();
  return 0;
}
