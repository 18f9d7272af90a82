// The distributed transform with real store servers and agents in one process (HTTP on
// loopback, in-process data plane): every element of every new tensor is checked
// against the synthetic oracle (the spec's slicing of a global tensor whose elements
// are a function of their index), through tp/pp/dp/zero changes, a redeployment,
// a lost host with and without surviving replicas.
#include "tenplex/transform/distributed.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "tenplex/model/gpt.h"
#include "tenplex/plan/synthetic.h"
#include "tenplex/store/server.h"
#include "tenplex/transform/agent.h"
#include "tenplex/transform/local.h"

namespace tenplex::transform {
namespace {

using nlohmann::json;

constexpr uint64_t kSeed = 11;

struct TestHost {
  std::unique_ptr<store::Store> store;
  std::unique_ptr<store::Server> server;
  std::unique_ptr<Agent> agent;
  std::thread thread;
  std::string url;

  void Start() {
    store = *store::Store::Open({});
    server = std::make_unique<store::Server>(*store, store::ServerOptions{});
    AgentOptions ao;
    ao.transport = "inproc";
    ao.transport_options.timeout = std::chrono::milliseconds(2000);
    agent = *Agent::Create(*store, ao);
    agent->Install(*server);
    Result<int> port = server->Bind("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    url = "http://127.0.0.1:" + std::to_string(*port);
    thread = std::thread([this] { (void)server->Serve(); });
  }
  // The host dies: its server and data plane go away (its store object stays, unused).
  void Kill() {
    if (!server) return;
    server->Stop();
    thread.join();
    server.reset();
    agent.reset();
  }
  ~TestHost() { Kill(); }
};

Model TinyGpt() {
  GptArgs a;
  a.num_layers = 4;
  a.hidden_size = 16;
  a.num_attention_heads = 4;
  a.num_query_groups = 2;
  a.ffn_hidden_size = 24;
  a.vocab_size = 101;
  a.make_vocab_size_divisible_by = 8;
  a.max_position_embeddings = 8;
  a.swiglu = true;
  return *MakeGpt(a);
}

class DistributedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = TinyGpt();
    hosts_.resize(6);
    for (auto& h : hosts_) {
      h = std::make_unique<TestHost>();
      h->Start();
    }
  }

  Cluster ClusterOf(std::vector<int> which, int k) {
    Cluster c;
    c.gpus_per_host = k;
    for (int h : which) c.hosts.push_back(hosts_[h]->url);
    return c;
  }

  // Version 1 of job "j" in `config` on the hosts of `cluster`, from the oracle.
  void Load(const Cluster& cluster, const std::string& config) {
    ParallelConfig cfg = *ParseConfig(config);
    Layout layout = *MakeLayout(model_, cfg);
    json info = {{"model", json::parse(ModelToJson(model_))},
                 {"config", cfg.ToString()},
                 {"cluster", {{"hosts", cluster.hosts}, {"gpus_per_host", cluster.gpus_per_host}}}};
    for (std::size_t h = 0; h < cluster.hosts.size(); ++h) {
      store::Store& st = *StoreOf(cluster.hosts[h]);
      ASSERT_TRUE(st.BeginVersion("j", 1, info.dump()).ok());
      for (const RankLayout& r : layout.ranks) {
        if (cluster.HostOfRank(r.rank) != static_cast<int>(h)) continue;
        for (const LocalTensor& t : *r.tensors) {
          Result<store::TensorWriter> w = st.Allocate(TensorPathOf("j", 1, r.rank, t.name), t.dtype, t.shape);
          ASSERT_TRUE(w.ok()) << w.status().ToString();
          ASSERT_TRUE(plan::FillSynthetic(layout, t, kSeed, w->data()).ok());
        }
      }
      ASSERT_TRUE(st.Commit("j", 1).ok());
    }
  }

  store::Store* StoreOf(const std::string& url) {
    for (auto& h : hosts_) {
      if (h->url == url) return h->store.get();
    }
    return nullptr;
  }

  // Every new rank's tensors on its host, element by element, and nothing else there.
  void Verify(const ClusterTransformStats& s, const std::string& config, int k) {
    Layout layout = *MakeLayout(model_, *ParseConfig(config));
    for (std::size_t h = 0; h < s.new_hosts.size(); ++h) {
      store::Store& st = *StoreOf(s.new_hosts[h]);
      Result<store::VersionInfo> v = st.Version("j", std::nullopt);
      ASSERT_TRUE(v.ok());
      EXPECT_EQ(v->version, s.to_version);
      std::size_t expected = 0;
      for (const RankLayout& r : layout.ranks) {
        if (r.rank / k != static_cast<int>(h)) continue;
        for (const LocalTensor& t : *r.tensors) {
          ++expected;
          Result<store::TensorRef> ref = st.Get(TensorPathOf("j", s.to_version, r.rank, t.name));
          ASSERT_TRUE(ref.ok()) << ref.status().ToString();
          Status c = plan::CheckSynthetic(layout, t, kSeed, ref->data());
          EXPECT_TRUE(c.ok()) << config << " rank " << r.rank << ": " << c.ToString();
        }
      }
      EXPECT_EQ(st.List("jobs/j/" + std::to_string(s.to_version) + "/")->size(), expected) << s.new_hosts[h];
    }
    int64_t fetched = 0;
    for (const HostTransformReport& r : s.hosts) fetched += r.bytes_fetched;
    EXPECT_EQ(fetched, s.plan.bytes_cross_host);
    EXPECT_EQ(s.plan.bytes_cross_host, s.plan.cross_host_lower_bound);
  }

  Model model_;
  std::vector<std::unique_ptr<TestHost>> hosts_;
};

TEST_F(DistributedTest, ChangesEveryDimensionExactly) {
  Cluster c = ClusterOf({0, 1, 2, 3}, 2);
  Load(c, "tp=2,pp=2,dp=2,zero=1");
  for (const char* to : {"tp=2,pp=4", "tp=1,pp=2,dp=4,zero=1", "tp=2,pp=2,dp=2", "tp=2,dp=4,zero=1", "tp=1,pp=1,dp=3"}) {
    Result<ClusterTransformStats> s = TransformCluster(c, "j", *ParseConfig(to), {});
    ASSERT_TRUE(s.ok()) << to << ": " << s.status().ToString();
    EXPECT_EQ(s->attempts, 1);
    EXPECT_TRUE(s->lost_hosts.empty());
    Verify(*s, to, 2);
    if (HasFailure()) return;
  }
}

TEST_F(DistributedTest, UnchangedTensorsAreLinkedNotCopied) {
  Cluster c = ClusterOf({0, 1, 2, 3}, 2);
  Load(c, "tp=2,pp=2");  // ranks 0-3 on hosts 0 and 1
  Result<ClusterTransformStats> s = TransformCluster(c, "j", *ParseConfig("tp=2,pp=2,dp=2,zero=1"), {});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  int64_t linked = 0;
  for (const HostTransformReport& h : s->hosts) linked += h.bytes_linked;
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
        Result<store::TensorRef> ref = hosts_[h]->store->Get(TensorPathOf("j", s->to_version, r.rank, t.name));
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
  EXPECT_NE(s.status().message().find("no surviving replica"), std::string::npos) << s.status().ToString();
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

TEST_F(DistributedTest, AgentRejectsMalformedRequests) {
  Agent& a = *hosts_[0]->agent;
  for (const char* bad : {"", "[]", "{}", R"({"job": "j"})",
                          R"({"job": "j", "from_version": 2, "to_version": 1, "host": 0, "addresses": ["x"]})",
                          R"({"job": "../x", "from_version": 1, "to_version": 2})",
                          R"({"job": "j", "from_version": 1, "to_version": 2, "host": 5, "addresses": ["x"]})",
                          R"({"job": "j", "unknown": 1})"}) {
    Result<std::string> r = a.Handle("POST", "/v1/transform/prepare", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad << ": " << r.status().ToString();
  }
  EXPECT_EQ(a.Handle("GET", "/v1/transform/prepare", "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Handle("GET", "/v1/transform/nothing", "").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(a.Handle("POST", "/v1/transform/probe", R"({"address": "inproc:zz"})").status().code(),
            StatusCode::kInvalidArgument);
  Result<std::string> addr = a.Handle("GET", "/v1/transform/address", "");
  ASSERT_TRUE(addr.ok());
  EXPECT_EQ(json::parse(*addr)["address"], a.address());
}

}  // namespace
}  // namespace tenplex::transform
