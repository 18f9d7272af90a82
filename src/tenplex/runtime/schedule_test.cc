#include "tenplex/runtime/schedule.h"

#include <gtest/gtest.h>

#include "tenplex/model/gpt.h"

namespace tenplex::runtime {
namespace {

Model Small() {
  GptArgs a;
  a.num_layers = 4;
  return *MakeGpt(a);
}

TEST(ScheduleTest, ParsesTheIssueExample) {
  auto s = ParseSchedule(R"([{"step": 0, "config": "tp=2,pp=2"}, {"step": 10, "config": "dp=3"},
      {"step": 20, "config": "tp=2,dp=2", "kill_ranks": [1], "kill_hosts": [1]}, {"step": 30, "stop": true}])",
                         Small());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->size(), 4u);
  EXPECT_EQ((*s)[1].config.dp, 3);
  EXPECT_EQ((*s)[2].kill_ranks, std::vector<int>{1});
  EXPECT_EQ((*s)[2].kill_hosts, std::vector<int>{1});
  EXPECT_TRUE((*s)[1].kill_hosts.empty());
  EXPECT_TRUE((*s)[3].stop);
}

TEST(ScheduleTest, RejectsBadSchedules) {
  struct Case {
    const char* text;
    const char* needle;
  } cases[] = {
      {"[", "not valid JSON"},
      {"{}", "non-empty JSON list"},
      {"[]", "non-empty JSON list"},
      {R"([{"step": 1, "config": "tp=1"}, {"step": 2, "stop": true}])", "start at step 0"},
      {R"([{"step": 0, "config": "tp=1"}, {"step": 0, "stop": true}])", "not after"},
      {R"([{"step": 0, "config": "tp=1"}])", "must end with"},
      {R"([{"step": 0, "config": "tp=1"}, {"step": 2, "stop": true}, {"step": 3, "config": "tp=1"}])",
       "must be the last"},
      {R"([{"step": 0, "config": "tp=3"}, {"step": 2, "stop": true}])", "entry 0"},
      {R"([{"step": 0, "config": "pp=3"}, {"step": 2, "stop": true}])", "L % pp"},
      {R"([{"step": 0, "config": "tp=2"}, {"step": 2, "config": "dp=2", "kill_ranks": [2]}, {"step": 3, "stop": true}])",
       "world size 2"},
      {R"([{"step": 0, "config": "tp=1", "kill_ranks": [0]}, {"step": 2, "stop": true}])",
       "first entry"},
      {R"([{"step": 0, "config": "tp=1", "stop": true}])", "either"},
      {R"([{"step": 0, "config": "tp=1", "kill_hosts": [0]}, {"step": 2, "stop": true}])",
       "first entry"},
      {R"([{"step": 0, "config": "tp=1"}, {"step": 2, "config": "tp=1", "kill_hosts": [-1]}, {"step": 3, "stop": true}])",
       "kill host -1"},
      {R"([{"step": 0, "config": "tp=1"}, {"step": 2, "config": "tp=1", "kill_hosts": 1}, {"step": 3, "stop": true}])",
       "list of host"},
      {R"([{"step": 0, "config": "tp=1", "bogus": 1}, {"step": 2, "stop": true}])",
       "unknown field 'bogus'"},
      {R"([{"step": "0", "config": "tp=1"}, {"step": 2, "stop": true}])", "integer"},
  };
  for (const Case& c : cases) {
    auto s = ParseSchedule(c.text, Small());
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_NE(s.status().message().find(c.needle), std::string::npos)
        << c.text << " -> " << s.status().message();
  }
}

TEST(ScheduleTest, Slowdown) {
  auto s = ParseSchedule(R"([{"step": 0, "config": "tp=2", "slowdown": {"1": 2.5}},
      {"step": 3, "config": "tp=2"}, {"step": 5, "config": "tp=2", "slowdown": {}},
      {"step": 6, "stop": true}])",
                         Small());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE((*s)[0].slowdown.has_value());
  EXPECT_EQ(SlowdownArg(*(*s)[0].slowdown), "1=2.5");
  EXPECT_FALSE((*s)[1].slowdown.has_value());
  ASSERT_TRUE((*s)[2].slowdown.has_value());
  EXPECT_EQ(SlowdownArg(*(*s)[2].slowdown), "");
  EXPECT_EQ(SlowdownArg({{0, 1.0}, {1, 2.0}, {3, 1.5}}), "1=2,3=1.5");
  for (const char* bad : {
           R"([{"step": 0, "config": "tp=2", "slowdown": {"2": 2}}, {"step": 1, "stop": true}])",
           R"([{"step": 0, "config": "tp=2", "slowdown": {"x": 2}}, {"step": 1, "stop": true}])",
           R"([{"step": 0, "config": "tp=2", "slowdown": {"1": 0.5}}, {"step": 1, "stop": true}])",
           R"([{"step": 0, "config": "tp=2", "slowdown": {"1": "2"}}, {"step": 1, "stop": true}])",
           R"([{"step": 0, "config": "tp=2", "slowdown": [1]}, {"step": 1, "stop": true}])",
       }) {
    auto r = ParseSchedule(bad, Small());
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("slowdown"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace tenplex::runtime
