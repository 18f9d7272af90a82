// Issue 34 finding 3: a host is its store daemon's stable host id (Store::host_id), not
// the URL it is reached by. A job placed while its daemons were reached by other
// addresses is found whole, transformed, and its new placement records the ids.
#include <gtest/gtest.h>

#include <cstring>

#include "tenplex/cluster/cluster.h"
#include "tenplex/cluster/cluster_state.h"
#include "tenplex/cluster/test_hosts.h"

namespace tenplex::cluster {
namespace {

class HostIdentityTest : public test_hosts::HostsFixture {
 protected:
  // The same hosts under addresses that reach nothing (TEST-NET-1), with their ids.
  Cluster Renamed(const Cluster& live, bool with_ids) {
    Cluster c = live;
    for (std::string& u : c.hosts)
      u.replace(0, std::strlen("http://127.0.0.1"), "http://192.0.2.2");
    if (with_ids) {
      for (const std::string& u : live.hosts) c.host_ids.push_back(StoreOf(u)->host_id());
    }
    return c;
  }

  Result<CommittedState> Find(const Cluster& live) {
    owned_.clear();
    std::vector<store::Client*> clients;
    for (const std::string& u : live.hosts) {
      owned_.push_back(*store::Client::Connect(u));
      clients.push_back(owned_.back().get());
    }
    return FindCommittedState(live.hosts, clients, "j", live);
  }

  std::vector<std::unique_ptr<store::Client>> owned_;
};

TEST_F(HostIdentityTest, ARecordedPlacementUnderOtherUrlsIsFoundByHostId) {
  const Cluster live = ClusterOf({0, 1}, 2);
  Load(live, "tp=2,pp=2,dp=1", Renamed(live, /*with_ids=*/true));
  Result<CommittedState> s = Find(live);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->rank_hosts, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(s->holders, (std::vector<int>{0, 1}));
  EXPECT_EQ(s->lost_ranks(), 0);
  // Listed in the other order: still each rank on its own daemon.
  s = Find(ClusterOf({1, 0}, 2));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->rank_hosts, (std::vector<int>{1, 1, 0, 0}));

  // A transform from it succeeds with every rank available, exactly, and its new
  // version records the ids of the hosts it placed the ranks on.
  Result<ClusterTransformStats> t = TransformCluster(live, "j", *ParseConfig("tp=1,pp=2,dp=2"), {});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->lost_hosts.empty());
  Verify(*t, "tp=1,pp=2,dp=2", 2);
  Result<store::VersionInfo> v = hosts_[0]->store->Version("j", std::nullopt);
  ASSERT_TRUE(v.ok());
  Result<StateInfo> info = StateInfo::Parse(v->info);
  ASSERT_TRUE(info.ok() && info->placement());
  EXPECT_EQ(info->placement()->host_ids,
            (std::vector<std::string>{hosts_[0]->store->host_id(), hosts_[1]->store->host_id()}));
}

TEST_F(HostIdentityTest, IdsWinOverUrlsAndOldInfosMatchByUrl) {
  const Cluster live = ClusterOf({0, 1}, 2);
  // Ids recorded crosswise: host 0's URL now reaches the daemon recorded second.
  Cluster crossed = live;
  crossed.host_ids = {hosts_[1]->store->host_id(), hosts_[0]->store->host_id()};
  Load(live, "tp=2,pp=2,dp=1", crossed);
  Result<CommittedState> s = Find(live);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->rank_hosts, (std::vector<int>{1, 1, 0, 0}));
  // An info without ids (an older build): matched by URL, so other URLs are lost hosts.
  for (auto& h : hosts_) (void)h->store->DeleteJob("j");
  Load(live, "tp=2,pp=2,dp=1", Renamed(live, /*with_ids=*/false));
  s = Find(live);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->lost_ranks(), 4);
  for (auto& h : hosts_) (void)h->store->DeleteJob("j");
  Load(live, "tp=2,pp=2,dp=1");
  s = Find(live);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->rank_hosts, (std::vector<int>{0, 0, 1, 1}));
}

TEST_F(HostIdentityTest, OneDaemonUnderTwoUrlsIsRefused) {
  Cluster c = ClusterOf({0}, 1);
  c.hosts.push_back("http://localhost:" + c.hosts[0].substr(c.hosts[0].rfind(':') + 1));
  auto clients = ConnectCluster(c, {});
  ASSERT_FALSE(clients.ok());
  EXPECT_EQ(clients.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(clients.status().message().find("same store daemon"), std::string::npos)
      << clients.status().ToString();
}

}  // namespace
}  // namespace tenplex::cluster
