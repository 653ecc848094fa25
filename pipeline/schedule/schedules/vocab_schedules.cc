// The 1F1B and V-shaped schedules with vocabulary parallelism: their passes
// placed by AddVocabularyPasses (vocab_passes.h), with the output layer's
// two-barrier algorithm ("_vocab") or its one-barrier one ("_vocab1").
#include "pipeline/schedule/ir/vocab_passes.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

absl::StatusOr<Schedule> WithVocabularyPasses(absl::string_view base_name, absl::string_view name,
                                              const ScheduleOptions& options, int barriers = 2) {
  absl::StatusOr<Schedule> base = MakeSchedule(base_name, options);
  if (!base.ok()) return base.status();
  absl::StatusOr<Schedule> out = AddVocabularyPasses(*base, barriers);
  if (out.ok()) out->name = std::string(name);
  return out;
}

}  // namespace

PP_REGISTER_SCHEDULE("1f1b_vocab",
                     "1f1b with vocabulary parallelism: embedding and head split over all ranks",
                     [](const ScheduleOptions& options) {
                       return WithVocabularyPasses("1f1b", "1f1b_vocab", options);
                     });
PP_REGISTER_SCHEDULE("zbv_vocab",
                     "zbv (V-Half) with vocabulary parallelism: embedding and head split over "
                     "all ranks",
                     [](const ScheduleOptions& options) {
                       return WithVocabularyPasses("zbv", "zbv_vocab", options);
                     });
PP_REGISTER_SCHEDULE("1f1b_vocab1",
                     "1f1b with vocabulary parallelism, one barrier before the last stage's "
                     "backward (OUT_T after it)",
                     [](const ScheduleOptions& options) {
                       return WithVocabularyPasses("1f1b", "1f1b_vocab1", options, 1);
                     });
PP_REGISTER_SCHEDULE("zbv_vocab1",
                     "zbv (V-Half) with vocabulary parallelism, one barrier before the last "
                     "stage's backward (OUT_T after it)",
                     [](const ScheduleOptions& options) {
                       return WithVocabularyPasses("zbv", "zbv_vocab1", options, 1);
                     });

}  // namespace pp
