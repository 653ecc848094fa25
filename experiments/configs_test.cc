// The configs experiments/ ships load and validate as the binaries they name
// would validate them (the driver's own tests use driver/testdata).
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "driver/experiment_config.h"
#include "models/gpt/gpt_config.pb.h"

namespace pp {
namespace {

ExperimentConfig Shipped(const std::string& name) {
  absl::StatusOr<ExperimentConfig> config = LoadExperimentConfig("experiments/configs/" + name);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ExperimentConfig();
}

TEST(ShippedConfigsTest, EveryShippedConfigIsValid) {
  for (const auto& entry : std::filesystem::directory_iterator("experiments/configs")) {
    if (entry.path().extension() != ".textproto") continue;
    SCOPED_TRACE(entry.path().string());
    absl::StatusOr<ExperimentConfig> config = LoadExperimentConfig(entry.path().string());
    ASSERT_TRUE(config.ok()) << config.status();
    ResolveDefaults(*config);
    const int world = WorldSizeOf(config->parallelism());
    EXPECT_TRUE(ValidateExperimentConfig(*config, world).ok())
        << ValidateExperimentConfig(*config, world);
  }
}

TEST(ShippedConfigsTest, MainConfigIsASmallGptOnTwoStagesWith1F1B) {
  ExperimentConfig c = Shipped("gpt_small_pp2.textproto");
  EXPECT_TRUE(c.model().HasExtension(gpt));
  EXPECT_EQ(c.parallelism().pp(), 2);
  EXPECT_EQ(c.parallelism().dp(), 1);
  EXPECT_EQ(c.parallelism().schedule(), "1f1b");
  EXPECT_EQ(c.data().path(), "/usr/share/common-licenses");
}

}  // namespace
}  // namespace pp
