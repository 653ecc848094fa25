#include "pipeline/schedule/formats/csv.h"

#include <cstdio>
#include <fstream>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

constexpr char kTestdata[] = "pipeline/schedule/schedules/testdata/";

// Every registered schedule, every shape it accepts from a small set, written
// in both forms and read back, is the same schedule (and the same program).
// Schedules registered later (by other packages linked into this test, or
// new built-ins) are covered without an edit here.
TEST(CsvTest, EveryRegisteredScheduleRoundTripsInBothForms) {
  int checked = 0;
  for (const std::string& name : RegisteredScheduleNames()) {
    int accepted = 0;
    for (int p : {1, 2, 3, 4}) {
      for (int m : {1, 2, 3, 4, 5, 8}) {
        for (int v : {1, 2, 3}) {
          absl::StatusOr<Schedule> s = MakeSchedule(name, {p, m, v, 0});
          if (!s.ok()) continue;
          ++accepted;
          SCOPED_TRACE(absl::StrCat(name, " p=", p, " m=", m, " v=", v));
          absl::StatusOr<LoweredProgram> program = Lower(*s);
          ASSERT_TRUE(program.ok()) << program.status();

          const std::string compute = ScheduleToCsv(*s);
          absl::StatusOr<Schedule> back = ParseCsvSchedule(compute);
          ASSERT_TRUE(back.ok()) << back.status() << "\n" << compute;
          EXPECT_EQ(back->num_stages, s->num_stages);
          EXPECT_EQ(back->num_microbatches, s->num_microbatches);
          EXPECT_EQ(back->num_chunks, s->num_chunks);
          EXPECT_EQ(back->forward_only, s->forward_only);
          EXPECT_EQ(back->stage_to_rank, s->stage_to_rank);
          EXPECT_EQ(back->ranks, s->ranks);
          EXPECT_TRUE(back->given_program.empty());
          absl::StatusOr<LoweredProgram> relowered = Lower(*back);
          ASSERT_TRUE(relowered.ok()) << relowered.status();
          EXPECT_EQ(relowered->ranks, program->ranks);

          const std::string comms = ProgramToCsv(*program);
          absl::StatusOr<Schedule> back_comms = ParseCsvSchedule(comms);
          ASSERT_TRUE(back_comms.ok()) << back_comms.status() << "\n" << comms;
          EXPECT_EQ(back_comms->stage_to_rank, s->stage_to_rank);
          EXPECT_EQ(back_comms->num_chunks, s->num_chunks);
          EXPECT_EQ(back_comms->forward_only, s->forward_only);
          EXPECT_EQ(back_comms->ranks, s->ranks);
          absl::StatusOr<LoweredProgram> given = Lower(*back_comms);
          ASSERT_TRUE(given.ok()) << given.status();
          EXPECT_EQ(given->ranks, program->ranks);
          EXPECT_EQ(ProgramToCsv(*given), comms);
          ++checked;
        }
      }
    }
    EXPECT_GT(accepted, 0) << name << " accepted no shape of the test's set";
  }
  EXPECT_GT(checked, 100);
}

TEST(CsvTest, WritesPyTorchLayoutAndThePlacementLineOnlyWhenNotLooped) {
  Schedule s = *MakeSchedule("1f1b", {2, 2, 1, 0});
  EXPECT_EQ(ScheduleToCsv(s), "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  Schedule v = *MakeSchedule("zbv", {2, 2, 2, 0});
  const std::string csv = ScheduleToCsv(v);
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "# stage_to_rank: v");
  // The compute + comms form has PyTorch's strings only: no REDUCE_TIED/STEP.
  const std::string comms = ProgramToCsv(*Lower(s));
  // PyTorch 2.15's loader: a forward send waited for after its micro-batch's
  // backward, backward sends at the end, REDUCE_GRAD with its wait.
  EXPECT_EQ(comms,
            "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0RECV_B1,0B1,0WAIT_SEND_F1,"
            "0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n"
            "1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1,1WAIT_SEND_B0,1WAIT_SEND_B1,"
            "1REDUCE_GRAD,1WAIT_REDUCE_GRAD\n");
  EXPECT_THAT(comms, Not(HasSubstr("STEP")));
  EXPECT_THAT(comms, Not(HasSubstr("REDUCE_TIED")));
}

TEST(CsvTest, HandWrittenFileWithIdleCellsAndCommentsIs1F1B) {
  absl::StatusOr<Schedule> s = LoadCsvScheduleFile(absl::StrCat(kTestdata, "1f1b_p2_m4.csv"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ranks, MakeSchedule("1f1b", {2, 4, 1, 0})->ranks);
  EXPECT_EQ(s->name, absl::StrCat("csv:", kTestdata, "1f1b_p2_m4.csv"));
  // Through the registry, with the shape checked against the request.
  const std::string name = absl::StrCat("csv:", kTestdata, "1f1b_p2_m4.csv");
  absl::StatusOr<Schedule> made = MakeSchedule(name, {2, 4, 1, 0});
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->ranks, s->ranks);
  absl::StatusOr<Schedule> wrong = MakeSchedule(name, {2, 8, 1, 0});
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(Message(wrong.status()), HasSubstr("micro-batches 0..3"));
  EXPECT_THAT(Message(wrong.status()), HasSubstr("m=8"));
  absl::StatusOr<Schedule> missing = MakeSchedule("csv:/nonexistent/x.csv", {2, 4, 1, 0});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing.status()), HasSubstr("/nonexistent/x.csv"));
}

TEST(CsvTest, ReadsPyTorchsComputeCommsFormSkippingFsdpActions) {
  absl::StatusOr<Schedule> s =
      LoadCsvScheduleFile(absl::StrCat(kTestdata, "pytorch_1f1b_p2_m2_comms.csv"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ranks, MakeSchedule("1f1b", {2, 2, 1, 0})->ranks);
  absl::StatusOr<LoweredProgram> program = Lower(*s);
  ASSERT_TRUE(program.ok()) << program.status();
  // The file's order of messages is kept; the tail is pipe's.
  EXPECT_EQ(ActionsToString(program->ranks[1]),
            "1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1B1 1SEND_B1 REDUCE_TIED 1REDUCE_GRAD STEP");
  LoweringOptions no_tail;
  no_tail.include_tail = false;
  EXPECT_EQ(ActionsToString(Lower(*s, no_tail)->ranks[0]),
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1");
}

TEST(CsvTest, QuotedCellsAndCrLf) {
  absl::StatusOr<Schedule> s = ParseCsvSchedule("\"0F0\",0B0\r\n1F0,\" 1B0 \"\r\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(ActionsToString(s->ranks[1]), "1F0 1B0");
}

TEST(CsvTest, PlacementFromLineOrOptionAndTheirConflict) {
  Schedule v = *MakeSchedule("zbv", {2, 3, 2, 0});
  std::string body = ScheduleToCsv(v);
  body = body.substr(body.find('\n') + 1);  // without the placement line
  // Without a line or option: inferred from the cells, as PyTorch does.
  absl::StatusOr<Schedule> inferred = ParseCsvSchedule(body);
  ASSERT_TRUE(inferred.ok()) << inferred.status();
  EXPECT_EQ(inferred->stage_to_rank, VPlacement(2));
  EXPECT_EQ(inferred->ranks, v.ranks);
  // Asking for looped: stage 3 is not on rank 0 there.
  CsvReadOptions looped_option;
  looped_option.stage_to_rank = "looped";
  absl::StatusOr<Schedule> looped = ParseCsvSchedule(body, looped_option);
  ASSERT_FALSE(looped.ok());
  EXPECT_THAT(Message(looped.status()),
              HasSubstr("\"3F0\": stage 3 is on rank 1 under the looped"));
  EXPECT_THAT(Message(looped.status()), HasSubstr("stage_to_rank"));
  CsvReadOptions o;
  o.stage_to_rank = "v";
  absl::StatusOr<Schedule> by_option = ParseCsvSchedule(body, o);
  ASSERT_TRUE(by_option.ok()) << by_option.status();
  EXPECT_EQ(by_option->ranks, v.ranks);
  o.stage_to_rank = "0,1,1,0";
  absl::StatusOr<Schedule> by_list = ParseCsvSchedule(body, o);
  ASSERT_TRUE(by_list.ok()) << by_list.status();
  EXPECT_EQ(by_list->stage_to_rank, VPlacement(2));
  absl::StatusOr<Schedule> by_line = ParseCsvSchedule("# stage_to_rank = 0,1,1,0\n" + body);
  ASSERT_TRUE(by_line.ok()) << by_line.status();
  o.stage_to_rank = "looped";
  absl::StatusOr<Schedule> conflict = ParseCsvSchedule("# stage_to_rank: v\n" + body, o);
  ASSERT_FALSE(conflict.ok());
  EXPECT_THAT(Message(conflict.status()), HasSubstr("line 1 places stages by \"v\""));
  EXPECT_THAT(Message(conflict.status()), HasSubstr("\"looped\""));
  o.stage_to_rank = "0,1,2,0";
  absl::StatusOr<Schedule> bad_rank = ParseCsvSchedule(body, o);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_THAT(Message(bad_rank.status()), HasSubstr("entry \"2\" is not a rank in [0, 2)"));
  o.stage_to_rank = "0,0,1,0";
  EXPECT_THAT(Message(ParseCsvSchedule(body, o).status()),
              HasSubstr("puts 3 stages on rank 0; every rank must hold 2"));
}

TEST(CsvTest, BadCellShowsLineColumnTextWhatIsValidAndTheGrid) {
  absl::StatusOr<Schedule> s = ParseCsvSchedule("# a comment\n0F0,0B0\n1F0,1Q0\n");
  ASSERT_FALSE(s.ok());
  const std::string m = Message(s.status());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m, HasSubstr("<csv>: line 3, column 2 (rank 1): \"1Q0\""));
  EXPECT_THAT(m, HasSubstr("unknown type \"Q\""));
  EXPECT_THAT(m, HasSubstr("expected <stage><F|B|I|W|"));
  EXPECT_THAT(m, HasSubstr("[1Q0]   <-- here"));
  EXPECT_THAT(m, HasSubstr(" column  rank 0"));
}

TEST(CsvTest, RuleViolationsNameTheCsvCell) {
  // B before its F on rank 1 (column 3 of line 2 once idle cells count).
  absl::StatusOr<Schedule> s = ParseCsvSchedule("0F0,0B0\n,1B0,1F0\n");
  ASSERT_FALSE(s.ok());
  const std::string m = Message(s.status());
  EXPECT_THAT(m, HasSubstr("rank 1 step 0"));
  EXPECT_THAT(m, HasSubstr("<csv> line 2, column 2: \"1B0\""));
  EXPECT_THAT(m, HasSubstr("<-- here"));
  // A forward missing: counts are checked.
  EXPECT_FALSE(ParseCsvSchedule("0F0,0F1,0B0,0B1\n1F0,1B0,1B1\n").ok());
  // Stages that do not fill whole chunks: as the cells place them, and
  // under the looped placement.
  EXPECT_THAT(Message(ParseCsvSchedule("0F0,2F0,2B0,0B0\n1F0,1B0\n").status()),
              HasSubstr("every rank must hold the same number of stages"));
  CsvReadOptions looped;
  looped.stage_to_rank = "looped";
  EXPECT_THAT(Message(ParseCsvSchedule("0F0,2F0,2B0,0B0\n1F0,1B0\n", looped).status()),
              HasSubstr("not a multiple of 2"));
}

TEST(CsvTest, CommsFormIsExecutedAsWritten) {
  // A receive that never comes: rank 1 waits for micro-batch 1 first, but
  // rank 0 sends 0 first. The validator runs the program with blocking sends.
  absl::StatusOr<Schedule> s = ParseCsvSchedule(
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
      "1RECV_F1,1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(Message(s.status()), HasSubstr("lowered program"));
  EXPECT_THAT(Message(s.status()), HasSubstr("<-- here"));
  // A message missing: rank 1's forward finds no input.
  EXPECT_FALSE(ParseCsvSchedule("0F0,0B0,0RECV_B0\n1F0,1B0,1SEND_B0\n").ok());
}

// PyTorch 2.15's compute + comms form: waits for sends and for REDUCE_GRAD
// (and FSDP's UNSHARD/RESHARD) are read and not run; a wait must follow what
// it waits for.
TEST(CsvTest, ReadsPyTorch215WaitsAndChecksTheirOrder) {
  const std::string rows =
      "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0RECV_B1,0B1,0WAIT_SEND_F1,"
      "0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0RESHARD\n"
      "1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1,1WAIT_SEND_B0,1WAIT_SEND_B1,"
      "1REDUCE_GRAD,1WAIT_REDUCE_GRAD\n";
  absl::StatusOr<Schedule> s = ParseCsvSchedule(rows);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ranks, MakeSchedule("1f1b", {2, 2, 1, 0})->ranks);
  EXPECT_EQ(s->given_program, Lower(*MakeSchedule("1f1b", {2, 2, 1, 0}))->ranks);

  absl::StatusOr<Schedule> early =
      ParseCsvSchedule("0F0,0WAIT_SEND_F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  ASSERT_FALSE(early.ok());
  EXPECT_THAT(Message(early.status()), HasSubstr("line 1, column 2 (rank 0): \"0WAIT_SEND_F0\""));
  EXPECT_THAT(Message(early.status()), HasSubstr("no 0SEND_F0 before it on this row"));
  absl::StatusOr<Schedule> reduce =
      ParseCsvSchedule("0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_REDUCE_GRAD\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  EXPECT_THAT(Message(reduce.status()), HasSubstr("no 0REDUCE_GRAD before it on this row"));
  absl::StatusOr<Schedule> elsewhere =
      ParseCsvSchedule("0F0,0SEND_F0,0RECV_B0,0B0,1UNSHARD\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  EXPECT_THAT(Message(elsewhere.status()), HasSubstr("stage 1 is not on rank 0"));
}

// A stage named on two rows cannot be placed: both cells are named.
TEST(CsvTest, AmbiguousPlacementNamesTheCells) {
  absl::StatusOr<Schedule> s = ParseCsvSchedule("0F0,0B0,1F1\n1F0,1B0\n");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(Message(s.status()),
              HasSubstr("cannot infer the placement: stage 1 is named on rank 0 (line 1, column "
                        "3: \"1F1\") and on rank 1 (line 2, column 1: \"1F0\")"));
  EXPECT_THAT(Message(s.status()), HasSubstr("<-- here"));
}

// Issue #29: formatting a CSV error was quadratic (a 100 KB cell widened
// every one of 100k columns). The error now shows a bounded window of the
// grid and of the cell: its size, not the time, is what this checks.
TEST(CsvTest, ErrorForAHugeCellAndManyColumnsIsSmall) {
  std::string text(100000, 'x');
  text += std::string(100000, ',');
  text += "\n1F0,1B0\n";
  absl::StatusOr<Schedule> s = ParseCsvSchedule(text);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(Message(s.status()), HasSubstr("line 1, column 1 (rank 0): \"xxxx"));
  EXPECT_THAT(Message(s.status()), HasSubstr("(100000 characters)"));
  EXPECT_THAT(Message(s.status()), HasSubstr("(columns 10..100001 not shown)"));
  EXPECT_LT(s.status().message().size(), 4000u);
  // A bad cell far to the right: the window around it.
  std::string far = "0F0" + std::string(50000, ',') + "0Q0\n1F0,1B0\n";
  absl::StatusOr<Schedule> f = ParseCsvSchedule(far);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(Message(f.status()), HasSubstr("column 50001 (rank 0): \"0Q0\""));
  EXPECT_THAT(Message(f.status()), HasSubstr("(columns 1..49992 not shown)"));
  EXPECT_LT(f.status().message().size(), 4000u);
}

// Issue #29: a FIFO blocked the reader, /dev/zero read until bad_alloc.
TEST(CsvTest, FileReadingRefusesFifosDevicesAndHugeFiles) {
  const std::string dir = ::testing::TempDir();
  const std::string fifo = dir + "/schedule_fifo.csv";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<Schedule> s = LoadCsvScheduleFile(fifo);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s.status()), HasSubstr(fifo + "\" is a FIFO"));
  s = LoadCsvScheduleFile("/dev/zero");
  EXPECT_THAT(Message(s.status()), HasSubstr("\"/dev/zero\" is a device"));
  s = LoadCsvScheduleFile(dir);
  EXPECT_THAT(Message(s.status()), HasSubstr("is a directory"));
  // A sparse file just over the limit (no disk space used).
  const std::string big = dir + "/schedule_big.csv";
  { std::ofstream file(big); }
  ASSERT_EQ(::truncate(big.c_str(), static_cast<off_t>(kMaxCsvFileBytes + 1)), 0);
  s = LoadCsvScheduleFile(big);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s.status()),
              HasSubstr(absl::StrCat("has ", kMaxCsvFileBytes + 1, " bytes; the limit is ")));
}

TEST(CsvTest, EmptyInputsAndLines) {
  EXPECT_THAT(Message(ParseCsvSchedule("").status()), HasSubstr("no rows"));
  EXPECT_THAT(Message(ParseCsvSchedule("# only a comment\n").status()), HasSubstr("no rows"));
  EXPECT_THAT(Message(ParseCsvSchedule(",,\n").status()), HasSubstr("no compute action"));
  EXPECT_THAT(Message(ParseCsvSchedule("0F0,0B0\n\n1F0,1B0\n").status()),
              HasSubstr("line 2 is empty"));
  EXPECT_THAT(Message(ParseCsvSchedule("#stage_to_rank v\n0F0,0B0\n").status()),
              HasSubstr("expected \"# stage_to_rank: looped\""));
}

}  // namespace
}  // namespace pp
