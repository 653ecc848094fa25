#include "pipeline/schedule/schedules/registry.h"

#include <algorithm>
#include <map>

#include <glog/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipeline/schedule/formats/csv.h"

namespace pp {
namespace {

// Function-local static: registrars in other translation units may run before
// any namespace-scope object here is constructed.
std::map<std::string, ScheduleInfo>& Registry() {
  static auto* registry = new std::map<std::string, ScheduleInfo>();
  return *registry;
}

}  // namespace

void RegisterSchedule(ScheduleInfo info) {
  if (info.name.empty() || !info.function) {
    LOG(FATAL) << "PP_REGISTER_SCHEDULE: empty name or null function";
  }
  auto [it, inserted] = Registry().emplace(info.name, info);
  if (!inserted) {
    LOG(FATAL) << "PP_REGISTER_SCHEDULE: schedule \"" << info.name << "\" registered twice (\""
               << it->second.description << "\" and \"" << info.description
               << "\"); schedule names must be unique";
  }
}

absl::StatusOr<Schedule> MakeSchedule(absl::string_view name, const ScheduleOptions& options) {
  if (absl::StartsWith(name, kCsvSchedulePrefix)) {
    const std::string path(name.substr(kCsvSchedulePrefix.size()));
    absl::StatusOr<Schedule> schedule = LoadCsvScheduleFile(path);
    if (!schedule.ok()) return schedule;
    if (schedule->num_stages != options.num_stages ||
        schedule->num_microbatches != options.num_microbatches ||
        schedule->num_chunks != options.num_chunks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule file ", path, " has ", schedule->num_stages, " rows (ranks), micro-batches 0..",
          schedule->num_microbatches - 1, " and ", schedule->num_chunks,
          " chunk(s) per rank, but p=", options.num_stages, ", m=", options.num_microbatches,
          ", v=", options.num_chunks, " were asked for; make them agree"));
    }
    return schedule;
  }
  auto it = Registry().find(std::string(name));
  if (it == Registry().end()) {
    return absl::NotFoundError(absl::StrCat("unknown schedule \"", name, "\"; registered: ",
                                            absl::StrJoin(RegisteredScheduleNames(), ", ")));
  }
  absl::Status common = CheckCommonOptions(options);
  if (!common.ok()) return common;
  absl::StatusOr<Schedule> schedule = it->second.function(options);
  if (!schedule.ok()) return schedule;
  schedule->name = it->second.name;
  const int p = schedule->num_stages;
  if (p != options.num_stages || schedule->num_microbatches != options.num_microbatches ||
      static_cast<int>(schedule->ranks.size()) != p ||
      static_cast<int>(schedule->stage_to_rank.size()) != p * schedule->num_chunks) {
    return absl::InternalError(absl::StrCat(
        "schedule \"", name, "\" returned a malformed Schedule: num_stages ", schedule->num_stages,
        ", num_microbatches ", schedule->num_microbatches, ", ", schedule->ranks.size(),
        " rank lists, placement of size ", schedule->stage_to_rank.size(),
        " (asked for p=", options.num_stages, ", m=", options.num_microbatches, ")"));
  }
  return schedule;
}

std::vector<ScheduleInfo> RegisteredSchedules() {
  std::vector<ScheduleInfo> out;
  for (const auto& [name, info] : Registry()) out.push_back(info);
  return out;
}

std::vector<std::string> RegisteredScheduleNames() {
  std::vector<std::string> out;
  for (const auto& [name, info] : Registry()) out.push_back(name);
  return out;
}

namespace internal_schedule {
ScheduleRegistrar::ScheduleRegistrar(const char* name, const char* description,
                                     ScheduleFunction function) {
  RegisterSchedule({name, description, std::move(function)});
}
}  // namespace internal_schedule

}  // namespace pp
