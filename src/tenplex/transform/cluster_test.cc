#include "tenplex/transform/cluster.h"

#include <gtest/gtest.h>

namespace tenplex::transform {
namespace {

TEST(ClusterTest, ParsesAndMapsRanks) {
  auto c = ParseCluster(
      R"({"hosts": ["http://127.0.0.1:1", "http://127.0.0.1:2"], "gpus_per_host": 2})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->Capacity(), 4);
  EXPECT_EQ(c->RankHosts(4), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(c->HostOfRank(3), 1);
}

TEST(ClusterTest, RejectsBadInput) {
  for (const char* bad : {"", "[]", R"({"hosts": [], "gpus_per_host": 1})",
                          R"({"hosts": ["http://a:1"], "gpus_per_host": 0})",
                          R"({"hosts": ["http://a:1"], "gpus_per_host": "2"})",
                          R"({"hosts": ["a:1"], "gpus_per_host": 1})",
                          R"({"hosts": ["http://a:1", "http://a:1"], "gpus_per_host": 1})",
                          R"({"hosts": ["http://a:1"], "gpus_per_host": 1, "extra": 1})"}) {
    auto c = ParseCluster(bad);
    EXPECT_FALSE(c.ok()) << bad;
    if (!c.ok()) {
      EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

}  // namespace
}  // namespace tenplex::transform
