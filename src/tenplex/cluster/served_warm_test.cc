// Each agent maps and pre-faults, at its prepare, exactly the old tensors that other
// hosts will fetch from it over the data plane (the prepare's "served", from the
// coordinator's plan), so that fetches do not map tensors page by page on the
// transport's thread (agent_maps.h). Checked against the whole plan of the same transform (MakePlan
// with the coordinator's host numbering), filtered by hand: per host, the distinct old
// tensors read by ops whose new rank is on another host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tenplex/cluster/distributed.h"
#include "tenplex/cluster/test_hosts.h"
#include "tenplex/plan/planner.h"

namespace tenplex::cluster {
namespace {

// tenplex_served_maps_prefaulted_total{when=`when`} in an agent's metrics text.
uint64_t Prefaulted(const std::string& metrics, const std::string& when) {
  return test_hosts::MetricValue(metrics,
                                 "tenplex_served_maps_prefaulted_total{when=\"" + when + "\"}");
}

class ServedWarmTest : public test_hosts::HostsFixture {
 protected:
  // For each URL of `all`: how many distinct old tensors (rank, tensor) of that host the
  // whole plan from `from` (on `from_cluster`) to `to` (on `to_cluster`) reads from other
  // hosts.
  std::vector<std::size_t> Served(const std::vector<std::string>& all, const std::string& from,
                                  const Cluster& from_cluster, const std::string& to,
                                  const Cluster& to_cluster) {
    const Layout a = *MakeLayout(model_, *ParseConfig(from));
    const Layout b = *MakeLayout(model_, *ParseConfig(to));
    auto hosts_of = [&](const Layout& l, const Cluster& c) {
      std::vector<int> h;
      for (const RankLayout& r : l.ranks) {
        const std::string& url = c.hosts[c.HostOfRank(r.rank)];
        h.push_back(static_cast<int>(std::find(all.begin(), all.end(), url) - all.begin()));
      }
      return h;
    };
    const std::vector<int> from_hosts = hosts_of(a, from_cluster);
    const std::vector<int> to_hosts = hosts_of(b, to_cluster);
    Result<plan::Plan> p = plan::MakePlan(model_, a, b, from_hosts, to_hosts);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    std::vector<std::set<std::pair<int, int>>> served(all.size());
    for (const plan::CopyOp& op : p->ops) {
      if (op.src_new) continue;
      const int src = from_hosts[op.src_rank];
      if (src != to_hosts[op.dst_rank]) served[src].insert({op.src_rank, op.src_tensor});
    }
    std::vector<std::size_t> n;
    for (const auto& s : served) n.push_back(s.size());
    return n;
  }

  // The index in hosts_ of the host at `url`.
  std::size_t IndexOf(const std::string& url) {
    for (std::size_t k = 0; k < hosts_.size(); ++k) {
      if (hosts_[k]->url == url) return k;
    }
    ADD_FAILURE() << "no host " << url;
    return 0;
  }
};

TEST_F(ServedWarmTest, EachAgentPrefaultsWhatPeersFetch) {
  const Cluster four = ClusterOf({0, 1, 2, 3}, 2), two = ClusterOf({2, 3}, 2);
  Load(four, "tp=2,pp=2");  // ranks 0-3 on hosts 0 and 1
  struct Step {
    std::string from, to;
    Cluster from_cluster, to_cluster;
  };
  // Scale out (the new hosts read), a TP and PP change (hosts 0 and 1 read from 2 and
  // 3), a move onto hosts 2 and 3 (hosts 0 and 1 only serve).
  const std::vector<Step> steps = {{"tp=2,pp=2", "tp=2,pp=2,dp=2", four, four},
                                   {"tp=2,pp=2,dp=2", "tp=1,pp=4", four, four},
                                   {"tp=1,pp=4", "tp=2,pp=2", four, two}};
  for (const Step& step : steps) {
    std::vector<std::string> before;
    for (auto& h : hosts_) before.push_back(h->agent->metrics());
    ClusterTransformOptions o;
    o.local_peer_reads = false;  // every fetched byte over the data plane
    if (step.to_cluster.hosts != step.from_cluster.hosts) o.to = step.to_cluster;
    Result<ClusterTransformStats> s =
        TransformCluster(step.from_cluster, "j", *ParseConfig(step.to), {}, o);
    ASSERT_TRUE(s.ok()) << step.to << ": " << s.status().ToString();
    ASSERT_EQ(s->attempts, 1) << step.to;
    Verify(*s, step.to, 2);
    const std::vector<std::size_t> want =
        Served(s->all_hosts, step.from, step.from_cluster, step.to, step.to_cluster);
    std::size_t total = 0;
    uint64_t fetch_mapped = 0;
    for (std::size_t h = 0; h < s->all_hosts.size(); ++h) {
      const std::size_t k = IndexOf(s->all_hosts[h]);
      const std::string& was = before[k];
      const std::string now = hosts_[k]->agent->metrics();
      EXPECT_EQ(Prefaulted(now, "prepare") - Prefaulted(was, "prepare"), want[h])
          << step.to << ", " << s->all_hosts[h];
      // A fetch that arrives before its server's own prepare warmed the tensor maps it
      // (the prepares run at once, with no barrier between them), so how many fetches
      // did is a race; on this machine it is 0 in most runs.
      fetch_mapped += Prefaulted(now, "fetch") - Prefaulted(was, "fetch");
      total += want[h];
    }
    EXPECT_GT(total, 0u) << step.to;
    RecordProperty(step.to + " mapped at fetch", std::to_string(fetch_mapped));
  }
}

// A warm body that is not a prepare's, or names a tensor the old layout lacks, is
// refused naming what is wrong; GET is not allowed.
TEST_F(ServedWarmTest, MalformedWarmsAreRefused) {
  Agent& a = *hosts_[0]->agent;
  for (const char* bad : {"", "[]", R"({"protocol": 3})",
                          R"({"protocol": 3, "job": "../x", "from_version": 1, "to_version": 2})",
                          R"({"protocol": 3, "job": "j", "unknown": 1})"}) {
    Result<std::string> r = a.Handle("POST", "/v1/transform/warm", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument)
        << bad << ": " << r.status().ToString();
  }
  // Another protocol is another build of tenplex, as for a prepare.
  EXPECT_EQ(
      a.Handle("POST", "/v1/transform/warm", R"({"protocol": 2, "job": "j"})").status().code(),
      StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.Handle("GET", "/v1/transform/warm", "").status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tenplex::cluster
