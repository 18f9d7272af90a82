// The distributed transform with real store servers and agents in one process (HTTP on
// loopback, in-process data plane): every element of every new tensor is checked
// against the synthetic oracle (the spec's slicing of a global tensor whose elements
// are a function of their index), through tp/pp/dp/zero changes, a redeployment,
// a lost host with and without surviving replicas.
#include "tenplex/cluster/distributed.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "tenplex/cluster/agent.h"
#include "tenplex/cluster/cluster_state.h"
#include "tenplex/cluster/control_protocol.h"
#include "tenplex/cluster/test_hosts.h"
#include "tenplex/cluster/two_phase.h"
#include "tenplex/model/gpt.h"
#include "tenplex/plan/synthetic.h"
#include "tenplex/store/parse.h"
#include "tenplex/store/server.h"
#include "tenplex/transform/local.h"

namespace tenplex::cluster {
namespace {

using nlohmann::json;

using test_hosts::kSeed;
using test_hosts::TestHost;
using test_hosts::TinyGpt;

class DistributedTest : public test_hosts::HostsFixture {};

TEST_F(DistributedTest, ChangesEveryDimensionExactly) {
  Cluster c = ClusterOf({0, 1, 2, 3}, 2);
  Load(c, "tp=2,pp=2,dp=2,zero=1");
  for (const char* to : {"tp=2,pp=4", "tp=1,pp=2,dp=4,zero=1", "tp=2,pp=2,dp=2", "tp=2,dp=4,zero=1",
                         "tp=1,pp=1,dp=3"}) {
    Result<ClusterTransformStats> s = TransformCluster(c, "j", *ParseConfig(to), {});
    ASSERT_TRUE(s.ok()) << to << ": " << s.status().ToString();
    EXPECT_EQ(s->attempts, 1);
    EXPECT_TRUE(s->lost_hosts.empty());
    Verify(*s, to, 2);
    if (HasFailure()) return;
  }
}

TEST_F(DistributedTest, SameHostReadsAndTheDataPlaneGiveTheSameState) {
  // The servers of this process share one machine and see each other's directories:
  // by default every fetched byte is read from the peers' files; without same-host
  // reads every byte goes over the (in-process) data plane. Both exact.
  Cluster c = ClusterOf({0, 1, 2, 3}, 2);
  Load(c, "tp=2,pp=2,dp=2,zero=1");
  const std::pair<bool, const char*> steps[] = {
      {false, "tp=2,pp=4"}, {true, "tp=1,pp=2,dp=4,zero=1"}, {false, "tp=2,pp=2,dp=2"}};
  for (const auto& [local, to] : steps) {
    ClusterTransformOptions o;
    o.local_peer_reads = local;
    Result<ClusterTransformStats> s = TransformCluster(c, "j", *ParseConfig(to), {}, o);
    ASSERT_TRUE(s.ok()) << to << ": " << s.status().ToString();
    Verify(*s, to, 2);
    int64_t fetched = 0, shm = 0;
    for (const HostTransformReport& h : s->hosts) {
      const PrepareReply& r = h.prepare;
      fetched += r.bytes_fetched;
      shm += r.bytes_fetched_shm;
      // The phases are parts of the host's time, one after another (local copies
      // overlap the fetches); sealing (checksums, manifest) happens wherever ranks land.
      EXPECT_LE(
          r.plan_seconds + r.warm_seconds + r.alloc_seconds + r.fetch_seconds + r.seal_seconds,
          r.seconds + 1e-3)
          << h.url;
      if (h.ranks > 0) {
        EXPECT_GT(r.seal_seconds, 0) << h.url;
      }
    }
    EXPECT_GT(fetched, 0) << to;
    EXPECT_EQ(shm, local ? fetched : 0) << to;
  }
}

TEST_F(DistributedTest, UnevenAndEvenConfigsExactlyAtTheLowerBound) {
  // Spec §9: uneven tp/dp weights to even and back across 4 hosts; Verify checks every
  // element and that the cross-host bytes equal the lower bound.
  Cluster c = ClusterOf({0, 1, 2, 3}, 2);
  Load(c, "tp=2,tp_weights=2+1,pp=2,dp=2,zero=1");
  for (const char* to : {"tp=2,pp=2,dp=2", "tp=2,tp_weights=1+3,pp=2,dp=2,dp_weights=3+1",
                         "tp=2,tp_weights=5+2,dp=4,zero=1", "tp=1,pp=4"}) {
    Result<ClusterTransformStats> s = TransformCluster(c, "j", *ParseConfig(to), {});
    ASSERT_TRUE(s.ok()) << to << ": " << s.status().ToString();
    Verify(*s, to, 2);
    if (HasFailure()) return;
  }
}

TEST_F(DistributedTest, UnchangedTensorsAreLinkedNotCopied) {
  Cluster c = ClusterOf({0, 1, 2, 3}, 2);
  Load(c, "tp=2,pp=2");  // ranks 0-3 on hosts 0 and 1
  Result<ClusterTransformStats> s =
      TransformCluster(c, "j", *ParseConfig("tp=2,pp=2,dp=2,zero=1"), {});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  int64_t linked = 0;
  for (const HostTransformReport& h : s->hosts) linked += h.prepare.bytes_linked;
  // A new rank with the (tp, pp) coordinates of the old rank of the same number (the
  // same device) keeps its parameters; optimizer state is resharded (zero=1).
  Layout from = *MakeLayout(model_, *ParseConfig("tp=2,pp=2"));
  Layout to = *MakeLayout(model_, *ParseConfig("tp=2,pp=2,dp=2,zero=1"));
  int64_t params = 0;
  for (int r = 0; r < 4; ++r) {
    if (to.ranks[r].tp != from.ranks[r].tp || to.ranks[r].pp != from.ranks[r].pp) continue;
    for (const LocalTensor& t : *to.ranks[r].tensors) {
      if (t.name.find("optimizer") == std::string::npos) params += t.bytes();
    }
  }
  EXPECT_GT(params, 0);
  EXPECT_EQ(linked, params);
  Verify(*s, "tp=2,pp=2,dp=2,zero=1", 2);  // the old version is released by now
}

// `tenplex transform --presize`: every host with new ranks makes exactly the files its
// prepare will allocate (its new tensors but the linked ones, those large enough to
// pool), nothing is written or committed, and the transform that follows takes them.
TEST_F(DistributedTest, PresizeMakesEachHostsNewTensorsAheadInItsPool) {
  GptArgs a;  // tensors on both sides of the pool's 256 KiB minimum
  a.num_layers = 2;
  a.hidden_size = 256;
  a.num_attention_heads = 4;
  a.ffn_hidden_size = 512;
  a.vocab_size = 1000;
  a.max_position_embeddings = 16;
  model_ = *MakeGpt(a);
  constexpr int64_t kPoolMin = store::kPoolMinBytes;
  Cluster c = ClusterOf({0, 1, 2, 3}, 2);
  Load(c, "tp=2,pp=2");  // ranks 0-3 on hosts 0 and 1; hosts 2 and 3 hold no tensor
  const char* to = "tp=2,pp=2,dp=2,zero=1";
  ClusterTransformOptions o;
  o.presize_only = true;
  Result<ClusterTransformStats> s = TransformCluster(c, "j", *ParseConfig(to), {}, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->presized.size(), 4u);
  bool small_skipped = false;
  // The oracle: a new rank's tensor is linked, not allocated, when its rank number had
  // the same (tp, pp) slice on the same host and it is a parameter (zero=1 reshards
  // the optimizer state), as UnchangedTensorsAreLinkedNotCopied establishes.
  Layout from = *MakeLayout(model_, *ParseConfig("tp=2,pp=2"));
  Layout layout = *MakeLayout(model_, *ParseConfig(to));
  for (int h = 0; h < 4; ++h) {
    int64_t wanted = 0, pooled = 0;
    for (const RankLayout& r : layout.ranks) {
      if (r.rank / 2 != h) continue;
      const bool same_device = r.rank < 4 && layout.ranks[r.rank].tp == from.ranks[r.rank].tp &&
                               layout.ranks[r.rank].pp == from.ranks[r.rank].pp;
      for (const LocalTensor& t : *r.tensors) {
        if (same_device && t.name.find("optimizer") == std::string::npos) continue;
        wanted += t.bytes();
        pooled += t.bytes() >= kPoolMin ? t.bytes() : 0;
      }
    }
    const HostPresizeReport& rep = s->presized[h];
    EXPECT_EQ(rep.url, hosts_[h]->url);
    EXPECT_EQ(rep.wanted_bytes, wanted) << "host " << h;
    EXPECT_GT(pooled, 0);
    small_skipped |= pooled < wanted;
    EXPECT_EQ(rep.pooled_bytes, pooled) << "host " << h;
    EXPECT_EQ(rep.poolable_bytes, pooled) << "host " << h;
    EXPECT_EQ(static_cast<int64_t>(hosts_[h]->store->pool_bytes()), pooled) << "host " << h;
    // Nothing written: every host still has version 1 (hosts 2 and 3 with no tensors).
    Result<store::VersionInfo> v = hosts_[h]->store->Version("j", std::nullopt);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(v->version, 1u);
    EXPECT_EQ(hosts_[h]->store->List("jobs/j/2/")->size(), 0u);
  }
  EXPECT_TRUE(small_skipped);  // some tensors were below the pool's minimum
  auto reused = [&](int h) {
    const std::string m = hosts_[h]->agent->metrics();
    const std::string key = "\ntenplex_transform_plans_reused_total ";
    const std::size_t at = m.find(key);
    return at == std::string::npos ? -1 : std::stoi(m.substr(at + key.size()));
  };
  for (int h = 0; h < 4; ++h) EXPECT_EQ(reused(h), 0) << "host " << h;
  o.presize_only = false;
  s = TransformCluster(c, "j", *ParseConfig(to), {}, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Verify(*s, to, 2);
  // The joining hosts' pools went into the new version (they release nothing).
  for (int h = 2; h < 4; ++h) EXPECT_EQ(hosts_[h]->store->pool_bytes(), 0u) << "host " << h;
  // Every host took the presize's plan instead of planning the same transform again.
  for (int h = 0; h < 4; ++h) EXPECT_EQ(reused(h), 1) << "host " << h;
  // The next transform (another config, other rank placements) is planned anew, and
  // exactly: a kept plan is only ever the one of the same inputs.
  const char* back = "tp=2,pp=2";
  s = TransformCluster(c, "j", *ParseConfig(back), {}, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Verify(*s, back, 2);
  for (int h = 0; h < 4; ++h) EXPECT_EQ(reused(h), 1) << "host " << h;
}

// A probe keeps a 512 MiB scratch region for its peers' probes; the daemon's next
// transform releases it (its memory goes to the new version).
TEST_F(DistributedTest, ATransformReleasesTheProbesScratchRegion) {
  Cluster c = ClusterOf({0, 1}, 2);
  Load(c, "tp=2,pp=2");
  const uint64_t before = hosts_[0]->store->used_bytes();
  // Both at once, as the benchmark probes: each fetches the other's scratch region.
  Result<std::string> r0 = InvalidArgument("not run"), r1 = InvalidArgument("not run");
  std::thread t([&] {
    r1 = hosts_[1]->agent->Handle(
        "POST", "/v1/transform/probe",
        json{{"address", hosts_[0]->agent->address()}, {"bytes", 1 << 20}}.dump());
  });
  r0 = hosts_[0]->agent->Handle(
      "POST", "/v1/transform/probe",
      json{{"address", hosts_[1]->agent->address()}, {"bytes", 1 << 20}}.dump());
  t.join();
  ASSERT_TRUE(r0.ok()) << r0.status().ToString();
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_GT(json::parse(*r0)["fresh_write_gbps"].get<double>(), 0);
  EXPECT_GE(hosts_[0]->store->used_bytes(), before + (512ull << 20));  // the scratch region
  Result<ClusterTransformStats> s = TransformCluster(c, "j", *ParseConfig("tp=2,dp=2"), {});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  for (int h = 0; h < 2; ++h) EXPECT_LT(hosts_[h]->store->used_bytes(), 64ull << 20) << h;
  Verify(*s, "tp=2,dp=2", 2);
}

TEST_F(DistributedTest, CentralBaselineGivesTheSameState) {
  Cluster c = ClusterOf({0, 1, 2, 3}, 2);
  Load(c, "tp=2,pp=2,dp=2,zero=1");
  ClusterTransformOptions o;
  o.central = true;
  Result<ClusterTransformStats> s = TransformCluster(c, "j", *ParseConfig("tp=1,pp=4,dp=2"), {}, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->round_seconds.size(), 3u);
  Layout layout = *MakeLayout(model_, *ParseConfig("tp=1,pp=4,dp=2"));
  for (int h = 0; h < 4; ++h) {
    for (const RankLayout& r : layout.ranks) {
      if (r.rank / 2 != h) continue;
      for (const LocalTensor& t : *r.tensors) {
        Result<store::TensorRef> ref =
            hosts_[h]->store->Get(store::TensorPathOf("j", s->to_version, r.rank, t.name));
        ASSERT_TRUE(ref.ok()) << ref.status().ToString();
        EXPECT_TRUE(plan::CheckSynthetic(layout, t, kSeed, ref->data()).ok()) << t.name;
      }
    }
  }
}

TEST_F(DistributedTest, RedeploysOntoOtherHosts) {
  Cluster c = ClusterOf({0, 1, 2, 3}, 2);
  Load(c, "tp=2,pp=2,dp=2,zero=1");
  ClusterTransformOptions o;
  o.to = ClusterOf({4, 5}, 4);
  Result<ClusterTransformStats> s = TransformCluster(c, "j", *ParseConfig("tp=2,pp=2,dp=2"), {}, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->new_hosts, o.to->hosts);
  Verify(*s, "tp=2,pp=2,dp=2", 4);
  // The old hosts still serve the old version (nothing of the new one lives there).
  for (int h = 0; h < 4; ++h) EXPECT_EQ(hosts_[h]->store->Version("j", std::nullopt)->version, 1u);
}

TEST_F(DistributedTest, SurvivesALostHostFromReplicas) {
  Cluster c = ClusterOf({0, 1, 2, 3}, 2);
  Load(c, "tp=2,pp=2,dp=2");
  hosts_[3]->Kill();
  Result<ClusterTransformStats> s = TransformCluster(c, "j", *ParseConfig("tp=2,pp=1,dp=3"), {});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->lost_hosts, std::vector<std::string>{hosts_[3]->url});
  EXPECT_EQ(s->new_hosts.size(), 3u);
  Verify(*s, "tp=2,pp=1,dp=3", 2);
}

TEST_F(DistributedTest, TotalLossFailsAndLeavesTheOldVersion) {
  Cluster c = ClusterOf({0, 1, 2, 3}, 2);
  Load(c, "tp=2,pp=2,dp=2,zero=1");  // optimizer shards have no replica
  hosts_[3]->Kill();
  Result<ClusterTransformStats> s = TransformCluster(c, "j", *ParseConfig("tp=2,pp=1,dp=3"), {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status().ToString();
  EXPECT_NE(s.status().message().find("no surviving replica"), std::string::npos)
      << s.status().ToString();
  for (int h = 0; h < 3; ++h) {
    Result<store::JobInfo> j = hosts_[h]->store->Job("j");
    ASSERT_TRUE(j.ok());
    EXPECT_EQ(j->current, std::optional<uint64_t>(1));
    EXPECT_EQ(j->versions.size(), 1u);
  }
}

TEST_F(DistributedTest, NotEnoughSlotsIsAClearError) {
  Cluster c = ClusterOf({0, 1}, 2);
  Load(c, "tp=2,pp=2");
  Result<ClusterTransformStats> s = TransformCluster(c, "j", *ParseConfig("tp=2,pp=2,dp=2"), {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("slots"), std::string::npos) << s.status().ToString();
  EXPECT_EQ(hosts_[0]->store->Version("j", std::nullopt)->version, 1u);
}

// The prepare request carries the protocol version and the digest of the receiver's
// part of the coordinator's plan; an agent plans its own part and runs it only when
// both match. Neither the whole plan's digest (version 2's) nor another host's part
// passes.
TEST_F(DistributedTest, AgentRefusesAnotherProtocolOrPlan) {
  const Cluster c = ClusterOf({0, 1}, 2);
  Load(c, "tp=2,pp=2");
  const ParallelConfig from = *ParseConfig("tp=2,pp=2"), to = *ParseConfig("tp=1,pp=2,dp=2");
  const Layout a = *MakeLayout(model_, from), b = *MakeLayout(model_, to);
  PrepareRequest req;
  req.job = "j";
  req.from_version = 1;
  req.to_version = 2;
  req.host = 1;
  req.info = hosts_[0]->store->Version("j", std::nullopt)->info;
  req.to_config = to;
  req.new_info = req.info;
  req.addresses = {hosts_[0]->agent->address(), hosts_[1]->agent->address()};
  req.from_hosts = c.RankHosts(a.world_size());
  req.to_hosts = c.RankHosts(b.world_size());
  const plan::Plan p = *plan::MakePlan(model_, a, b, req.from_hosts, req.to_hosts);
  const std::vector<HostPart> parts = HostPlanParts(p, req.from_hosts, req.to_hosts, 2);
  ASSERT_NE(parts[0].plan_digest, parts[1].plan_digest);
  req.served = parts[1].served;
  Agent& agent = *hosts_[1]->agent;

  for (const std::string& wrong :
       {std::string("0123456789abcdef"), PlanDigest(p), parts[0].plan_digest}) {
    req.host_plan_digest = wrong;
    ASSERT_NE(req.host_plan_digest, parts[1].plan_digest);
    Result<std::string> r = agent.Handle("POST", "/v1/transform/prepare", EncodePrepare(req));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
    EXPECT_NE(r.status().message().find("digest " + parts[1].plan_digest), std::string::npos)
        << r.status().message();
  }

  req.host_plan_digest = parts[1].plan_digest;
  json other = json::parse(EncodePrepare(req));
  other["protocol"] = kControlProtocolVersion + 1;
  Result<std::string> r = agent.Handle("POST", "/v1/transform/prepare", other.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find("version " + std::to_string(kControlProtocolVersion + 1)),
            std::string::npos)
      << r.status().message();
  other.erase("protocol");
  EXPECT_EQ(agent.Handle("POST", "/v1/transform/prepare", other.dump()).status().code(),
            StatusCode::kFailedPrecondition);
  // Nothing was begun by the refused requests.
  EXPECT_FALSE(hosts_[1]->store->Version("j", 2).ok());

  // The same request with the right digest runs (and its open version is dropped).
  r = agent.Handle("POST", "/v1/transform/prepare", EncodePrepare(req));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(hosts_[1]->store->DropVersion("j", 2).ok());
}

// One rule for where a job's committed state lives across hosts (cluster_state.h).
TEST_F(DistributedTest, FindsTheCommittedStateAndItsLostRanks) {
  const Cluster c = ClusterOf({0, 1, 2}, 2);  // ranks 2h, 2h+1 on host h
  Load(c, "tp=2,pp=2,dp=1");                  // 4 ranks on hosts 0, 1 (placement: hosts 0-2, K=2)
  std::vector<std::string> urls = {hosts_[0]->url, hosts_[1]->url, hosts_[2]->url, hosts_[3]->url};
  std::vector<std::unique_ptr<store::Client>> owned;
  std::vector<store::Client*> clients;
  for (const std::string& u : urls) {
    owned.push_back(*store::Client::Connect(u));
    clients.push_back(owned.back().get());
  }
  Result<CommittedState> s = FindCommittedState(urls, clients, "j", ClusterOf({5}, 1));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->version, 1u);
  EXPECT_EQ(s->info.config().ToString(), "tp=2,pp=2,dp=1");
  EXPECT_EQ(s->placement.hosts, c.hosts);  // the info's, not the fallback
  EXPECT_EQ(s->rank_hosts, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(s->holders, (std::vector<int>{0, 1}));
  EXPECT_TRUE(s->unavailable.empty());
  EXPECT_EQ(s->lost_ranks(), 0);

  // A host that is known lost (null client), a host with a newer version of other
  // info (it is then the state and host 0 is stale), and a dead host.
  clients[1] = nullptr;
  s = FindCommittedState(urls, clients, "j", c);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->rank_hosts, (std::vector<int>{0, 0, plan::kLostHost, plan::kLostHost}));
  EXPECT_EQ(s->unavailable, (std::vector<int>{1}));
  EXPECT_EQ(s->lost_ranks(), 2);
  clients[1] = owned[1].get();
  hosts_[1]->Kill();
  s = FindCommittedState(urls, clients, "j", c);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->rank_hosts, (std::vector<int>{0, 0, plan::kLostHost, plan::kLostHost}));
  EXPECT_EQ(s->unavailable, (std::vector<int>{1}));
  // A stale host: host 3 has a newer version of the job, so host 0 no longer holds the state.
  json info = {{"model", json::parse(ModelToJson(model_))}, {"config", "tp=1,pp=1,dp=1"}};
  ASSERT_TRUE(hosts_[3]->store->BeginVersion("j", 5, info.dump()).ok());
  ASSERT_TRUE(hosts_[3]->store->Commit("j", 5).ok());
  s = FindCommittedState(urls, clients, "j", ClusterOf({3}, 1));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->version, 5u);
  EXPECT_EQ(s->rank_hosts, (std::vector<int>{3}));
  // Hosts of the placement that are not given are lost too.
  s = FindCommittedState({urls[0], urls[1], urls[2]}, {clients[0], clients[1], clients[2]}, "j", c);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->version, 1u);
  EXPECT_EQ(s->rank_hosts, (std::vector<int>{0, 0, plan::kLostHost, plan::kLostHost}));
  s = FindCommittedState({urls[1]}, {clients[1]}, "j", c);  // only the dead host
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable) << s.status().ToString();
  EXPECT_EQ(FindCommittedState({urls[2]}, {clients[2]}, "nojob", c).status().code(),
            StatusCode::kNotFound);
  // No answering host holds it, one did not answer: the error names that one (it may).
  s = FindCommittedState({urls[1], urls[2]}, {clients[1], clients[2]}, "nojob", c);
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("1 of 2 hosts did not answer: " + urls[1] + ")"),
            std::string::npos)
      << s.status().ToString();
}

// The recovery's decision rule (two_phase.h) against a table of half-done two-phase
// commits of version 2 on hosts 0-3 (v1 committed everywhere): for each row, the state
// every host is left in, applied by hand, and the outcome the rule demands.
TEST_F(DistributedTest, RecoveryFinishesOrRollsBackHalfCommittedVersions) {
  Cluster c = ClusterOf({0, 1, 2, 3}, 2);
  std::vector<std::string> urls = c.hosts;
  std::vector<std::unique_ptr<store::Client>> owned;
  std::vector<store::Client*> clients;
  for (const std::string& u : urls) {
    owned.push_back(*store::Client::Connect(u));
    clients.push_back(owned.back().get());
  }
  enum S { kNone, kOpen, kPrepared, kCommitted };
  struct Row {
    std::vector<S> hosts;
    bool owner;
    const char* expect;  // "commit", "abort", "pending"
  };
  const std::vector<Row> rows = {
      {{kCommitted, kCommitted, kCommitted, kPrepared}, false, "commit"},  // the commit window
      {{kCommitted, kPrepared, kPrepared, kPrepared}, true, "commit"},
      {{kPrepared, kPrepared, kPrepared, kPrepared}, false, "commit"},  // coordinator died
      {{kPrepared, kPrepared, kOpen, kPrepared}, true, "abort"},        // one never prepared
      {{kPrepared, kNone, kPrepared, kPrepared}, true, "abort"},        // one aborted it
      {{kPrepared, kNone, kPrepared, kPrepared}, false, "pending"},     // readers only roll forward
      {{kOpen, kOpen, kNone, kNone}, true, "abort"},                    // leftovers of a dead load
  };
  json info = {{"model", json::parse(ModelToJson(model_))}, {"config", "tp=2,pp=2,dp=2"}};
  info["cluster"] = {{"hosts", c.hosts}, {"gpus_per_host", 2}};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    for (int h = 0; h < 4; ++h) {
      store::Store& st = *hosts_[h]->store;
      (void)st.DeleteJob("j");
      ASSERT_TRUE(st.BeginVersion("j", 1, info.dump()).ok());
      ASSERT_TRUE(st.Put("jobs/j/1/rank-00000/x", DType::kU8, {3}, "old", 3).ok());
      ASSERT_TRUE(st.Commit("j", 1).ok());
      if (rows[i].hosts[h] == kNone) continue;
      ASSERT_TRUE(st.BeginVersion("j", 2, info.dump()).ok());
      ASSERT_TRUE(st.Put("jobs/j/2/rank-00000/x", DType::kU8, {3}, "new", 3).ok());
      if (rows[i].hosts[h] >= kPrepared) {
        ASSERT_TRUE(st.Prepare("j", 2).ok());
      }
      if (rows[i].hosts[h] == kCommitted) {
        ASSERT_TRUE(st.Commit("j", 2, /*keep_old=*/true).ok());
      }
    }
    Result<Resolution> r = ResolvePending(urls, clients, "j", rows[i].owner);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const std::string expect = rows[i].expect;
    for (int h = 0; h < 4; ++h) {
      Result<store::JobInfo> j = hosts_[h]->store->Job("j");
      ASSERT_TRUE(j.ok());
      if (expect == "commit") {
        // Every host that had it is at version 2, and version 1 is released everywhere.
        EXPECT_EQ(j->current, std::optional<uint64_t>(rows[i].hosts[h] == kNone ? 1 : 2));
        EXPECT_EQ(j->versions.size(), 1u);
      } else if (expect == "abort") {
        EXPECT_EQ(j->current, std::optional<uint64_t>(1));
        EXPECT_EQ(j->versions.size(), 1u);
      } else {
        EXPECT_EQ(j->current, std::optional<uint64_t>(1));
        EXPECT_EQ(j->versions.size(), rows[i].hosts[h] == kNone ? 1u : 2u);
      }
    }
    EXPECT_EQ(r->committed.size(), expect == "commit" ? 1u : 0u);
    EXPECT_EQ(r->aborted.size(), expect == "abort" ? 1u : 0u);
    EXPECT_EQ(r->pending.size(), expect == "pending" ? 1u : 0u);
  }
  // A participant that does not answer: undecided for a reader and for an owner alike
  // (it may have committed), unless another host committed it.
  for (int h = 0; h < 4; ++h) {
    store::Store& st = *hosts_[h]->store;
    (void)st.DeleteJob("j");
    ASSERT_TRUE(st.BeginVersion("j", 1, info.dump()).ok());
    ASSERT_TRUE(st.Commit("j", 1).ok());
    ASSERT_TRUE(st.BeginVersion("j", 2, info.dump()).ok());
    ASSERT_TRUE(st.Prepare("j", 2).ok());
  }
  std::vector<store::Client*> without3 = clients;
  without3[3] = nullptr;
  Result<Resolution> r = ResolvePending(urls, without3, "j", /*owner=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->pending, (std::vector<uint64_t>{2}));
  ASSERT_TRUE(hosts_[0]->store->Commit("j", 2, /*keep_old=*/true).ok());
  r = ResolvePending(urls, without3, "j", /*owner=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->committed, (std::vector<uint64_t>{2}));
  for (int h = 0; h < 3; ++h) {
    EXPECT_EQ(hosts_[h]->store->Job("j")->current, 2u);
    EXPECT_EQ(hosts_[h]->store->Job("j")->versions.size(), 2u);  // v1 kept: 3 has not committed
  }
  EXPECT_EQ(hosts_[3]->store->Job("j")->current, 1u);  // when it answers again
  r = ResolvePending(urls, clients, "j", /*owner=*/false);
  ASSERT_TRUE(r.ok());
  for (int h = 0; h < 4; ++h) {
    EXPECT_EQ(hosts_[h]->store->Job("j")->current, 2u);
    EXPECT_EQ(hosts_[h]->store->Job("j")->versions.size(), 1u);
  }
}

TEST_F(DistributedTest, AgentRejectsMalformedRequests) {
  Agent& a = *hosts_[0]->agent;
  for (const char* bad :
       {"", "[]", R"({"protocol": 3})", R"({"protocol": 3, "job": "j"})",
        R"({"protocol": 3, "job": "j", "from_version": 2, "to_version": 1, "host": 0,
                              "addresses": ["x"]})",
        R"({"protocol": 3, "job": "../x", "from_version": 1, "to_version": 2})",
        R"({"protocol": 3, "job": "j", "from_version": 1, "to_version": 2, "host": 5,
                              "addresses": ["x"]})",
        R"({"protocol": 3, "job": "j", "unknown": 1})"}) {
    for (const char* endpoint : {"/v1/transform/prepare", "/v1/transform/presize"}) {
      Result<std::string> r = a.Handle("POST", endpoint, bad);
      ASSERT_FALSE(r.ok()) << endpoint << " " << bad;
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument)
          << endpoint << " " << bad << ": " << r.status().ToString();
    }
  }
  EXPECT_EQ(a.Handle("GET", "/v1/transform/presize", "").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Handle("GET", "/v1/transform/prepare", "").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Handle("GET", "/v1/transform/nothing", "").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(a.Handle("POST", "/v1/transform/probe", R"({"address": "inproc:zz"})").status().code(),
            StatusCode::kInvalidArgument);
  Result<std::string> addr = a.Handle("GET", "/v1/transform/address", "");
  ASSERT_TRUE(addr.ok());
  EXPECT_EQ(json::parse(*addr)["address"], a.address());
}

}  // namespace
}  // namespace tenplex::cluster
