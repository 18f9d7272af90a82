// "gpus": N schedule entries: resolved by the chooser (here a stand-in that records its
// arguments), checked like config entries afterwards, and clear errors.
#include <gtest/gtest.h>

#include "tenplex/model/gpt.h"
#include "tenplex/runtime/schedule.h"

namespace tenplex::runtime {
namespace {

Model Small() {
  GptArgs a;
  a.num_layers = 4;
  return *MakeGpt(a);
}

TEST(ScheduleGpusTest, GpusEntriesGetTheChoosersConfig) {
  std::vector<std::string> calls;
  ConfigChooser choose = [&](int gpus, const std::string& profile,
                             const std::string& memory) -> Result<ChosenConfig> {
    calls.push_back(std::to_string(gpus) + "/" + profile + "/" + memory);
    ParallelConfig c;
    c.pp = gpus >= 2 ? 2 : 1;
    c.dp = gpus / c.pp;
    return ChosenConfig{c, {"--micro-batch-size", std::to_string(gpus)}};
  };
  auto s = ParseSchedule(R"([{"step": 0, "gpus": 4, "device_profile": "cpu", "gpu_memory": "1MiB"},
      {"step": 3, "config": "tp=2"}, {"step": 5, "gpus": 1, "kill_ranks": [1]}, {"step": 6, "stop": true}])",
                         Small(), choose);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(calls, (std::vector<std::string>{"4/cpu/1MiB", "1//"}));
  EXPECT_EQ((*s)[0].config.ToString(), "tp=1,pp=2,dp=2");
  EXPECT_EQ((*s)[0].gpus, 4);
  EXPECT_EQ((*s)[0].worker_args, (std::vector<std::string>{"--micro-batch-size", "4"}));
  EXPECT_EQ((*s)[1].gpus, 0);
  EXPECT_TRUE((*s)[1].worker_args.empty());
  EXPECT_EQ((*s)[2].config.world_size(), 1);
  EXPECT_EQ((*s)[2].kill_ranks, std::vector<int>{1});
}

TEST(ScheduleGpusTest, Errors) {
  ConfigChooser fail = [](int gpus, const std::string&,
                          const std::string&) -> Result<ChosenConfig> {
    return ResourceExhausted("nothing fits on " + std::to_string(gpus));
  };
  ConfigChooser ok = [](int, const std::string&, const std::string&) -> Result<ChosenConfig> {
    return ChosenConfig{};
  };
  struct Case {
    const char* json;
    ConfigChooser chooser;
    const char* needle;
  };
  const Case cases[] = {
      {R"([{"step": 0, "gpus": 2}, {"step": 1, "stop": true}])", nullptr, "need the config policy"},
      {R"([{"step": 0, "gpus": 2}, {"step": 1, "stop": true}])", fail,
       "entry 0 (2 GPUs): nothing fits on 2"},
      {R"([{"step": 0, "gpus": 0}, {"step": 1, "stop": true}])", ok,
       "'gpus' must be an integer >= 1"},
      {R"([{"step": 0, "gpus": "4"}, {"step": 1, "stop": true}])", ok,
       "'gpus' must be an integer >= 1"},
      {R"([{"step": 0, "gpus": 2, "config": "tp=2"}, {"step": 1, "stop": true}])", ok,
       "one of 'config', 'gpus'"},
      {R"([{"step": 0, "gpus": 2, "gpu_memory": 5}, {"step": 1, "stop": true}])", ok,
       "'gpu_memory' must be a string"},
      {R"([{"step": 0, "config": "tp=1", "gpu_memory": "1G"}, {"step": 1, "stop": true}])", ok,
       "go with 'gpus'"},
      {R"([{"step": 0, "gpus": 1}, {"step": 1, "gpus": 1, "kill_ranks": [1]}, {"step": 2, "stop": true}])",
       ok, "kill rank 1 is not a rank"},
  };
  for (const Case& c : cases) {
    auto s = ParseSchedule(c.json, Small(), c.chooser);
    ASSERT_FALSE(s.ok()) << c.json;
    EXPECT_NE(s.status().message().find(c.needle), std::string::npos) << s.status().message();
  }
}

}  // namespace
}  // namespace tenplex::runtime
