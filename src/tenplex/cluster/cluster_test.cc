#include "tenplex/cluster/cluster.h"

#include <gtest/gtest.h>

namespace tenplex::cluster {
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
                          R"({"hosts": ["http://a:1"], "gpus_per_host": 1, "extra": 1})",
                          R"({"hosts": ["http://a:1"], "gpus_per_host": 1, "host_ids": []})",
                          R"({"hosts": ["http://a:1"], "gpus_per_host": 1, "host_ids": [7]})"}) {
    auto c = ParseCluster(bad);
    EXPECT_FALSE(c.ok()) << bad;
    if (!c.ok()) {
      EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

// Issue 34 finding 3: a placement's host ids survive the JSON round trip, parallel to
// its hosts; none known writes none (the format older builds read).
TEST(ClusterTest, HostIdsRoundTrip) {
  Cluster c;
  c.hosts = {"http://a:1", "http://b:2"};
  c.gpus_per_host = 2;
  EXPECT_FALSE(ClusterJson(c).contains("host_ids"));
  c.host_ids = {"", "00ff"};
  auto back = ParseCluster(ClusterJson(c).dump());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->hosts, c.hosts);
  EXPECT_EQ(back->host_ids, c.host_ids);
  EXPECT_EQ(back->HostId(1), "00ff");
  EXPECT_EQ(back->HostId(5), "");
}

}  // namespace
}  // namespace tenplex::cluster
