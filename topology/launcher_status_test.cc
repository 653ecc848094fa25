#include "topology/launcher_status.h"

#include <stdlib.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

namespace pp {
namespace {

// One test: the worker side maps the page named by the environment once per
// process, as in a launched worker.
TEST(LauncherStatusTest, TheLauncherReadsWhatTheWorkerReported) {
  auto page = WorkerStatusPage::Create();
  ASSERT_TRUE(page.ok()) << page.status();
  WorkerStatusPage::Snapshot before = (*page)->Read();
  EXPECT_EQ(before.stage, -1);
  EXPECT_EQ(before.data_index, -1);
  EXPECT_EQ(before.action, "");
  EXPECT_EQ(before.step, -1);
  EXPECT_EQ(WorkerStatusPage::Describe(before), "");

  // The worker maps its own descriptor and closes it: give it a copy.
  ASSERT_EQ(::setenv(kWorkerStatusFdVariable, std::to_string(::dup((*page)->fd())).c_str(), 1), 0);
  ASSERT_TRUE(WorkerStatusEnabled());
  ReportWorkerAction("train step 0 0F0");
  EXPECT_EQ(WorkerStatusPage::Describe((*page)->Read()), "last action train step 0 0F0");
  ReportWorkerPlace(1, 2);
  ReportWorkerAction("train step 3 1RECV_B2");
  ReportWorkerAction("train step 3 1B2");
  ReportWorkerStep(3);
  WorkerStatusPage::Snapshot now = (*page)->Read();
  EXPECT_EQ(now.stage, 1);
  EXPECT_EQ(now.data_index, 2);
  EXPECT_EQ(now.action, "train step 3 1B2");
  EXPECT_EQ(now.step, 3);
  EXPECT_EQ(WorkerStatusPage::Describe(now),
            "pipeline stage 1, data-parallel index 2; last action train step 3 1B2");
  // Long names are cut, not overrun.
  ReportWorkerAction(std::string(1000, 'x'));
  EXPECT_EQ((*page)->Read().action, std::string(255, 'x'));
}

TEST(LauncherStatusTest, DescribeGivesWhatIsKnown) {
  EXPECT_EQ(WorkerStatusPage::Describe({.stage = 0, .data_index = -1, .action = ""}),
            "pipeline stage 0");
  EXPECT_EQ(WorkerStatusPage::Describe({.stage = -1, .data_index = 3, .action = "STEP"}),
            "data-parallel index 3; last action STEP");
}

}  // namespace
}  // namespace pp
