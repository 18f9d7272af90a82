#include "tenplex/io/state_info.h"

#include <gtest/gtest.h>

#include "tenplex/cluster/test_hosts.h"

namespace tenplex::cluster {
namespace {

// A version info of the elastic API: the user's own fields, no "model".
constexpr char kElasticInfo[] =
    R"({"config": "tp=1,pp=1,dp=2", "step": 7, "cluster": {"hosts": ["http://a:1", "http://b:2"], "gpus_per_host": 1}})";

TEST(StateInfoTest, ModelIsRequiredUnlessSaidOtherwise) {
  Result<StateInfo> strict = StateInfo::Parse(kElasticInfo);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("no \"model\" object"), std::string::npos);

  Result<StateInfo> lax = StateInfo::Parse(kElasticInfo, StateInfo::ModelRequired::kNo);
  ASSERT_TRUE(lax.ok()) << lax.status().message();
  EXPECT_FALSE(lax->has_model());
  EXPECT_EQ(lax->config().ToString(), "tp=1,pp=1,dp=2");
  EXPECT_EQ(lax->step(), 7);
  ASSERT_TRUE(lax->placement().has_value());
  EXPECT_EQ(lax->placement()->hosts.size(), 2u);
  // The text is kept as it was: nothing is added for the missing model.
  EXPECT_EQ(nlohmann::json::parse(lax->ToJson()), nlohmann::json::parse(kElasticInfo));
}

TEST(StateInfoTest, APresentModelIsCheckedEitherWay) {
  for (auto req : {StateInfo::ModelRequired::kYes, StateInfo::ModelRequired::kNo}) {
    Result<StateInfo> bad = StateInfo::Parse(R"({"model": 3, "config": "tp=1"})", req);
    EXPECT_FALSE(bad.ok());
    Result<StateInfo> no_config = StateInfo::Parse(R"({"step": 1})", req);
    ASSERT_FALSE(no_config.ok());
    const bool lax = req == StateInfo::ModelRequired::kNo;
    EXPECT_NE(no_config.status().message().find(lax ? "\"config\"" : "\"model\""),
              std::string::npos)
        << no_config.status().message();
  }
  const StateInfo made = StateInfo::Make(test_hosts::TinyGpt(), *ParseConfig("tp=2"));
  Result<StateInfo> back = StateInfo::Parse(made.ToJson(), StateInfo::ModelRequired::kNo);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->has_model());
  EXPECT_EQ(back->model().num_layers, made.model().num_layers);
}

}  // namespace
}  // namespace tenplex::cluster
