// Test fixture of the cluster tests (distributed_test.cc, host_identity_test.cc,
// fencing_test.cc): store daemons with their transform agents in one process (HTTP on
// loopback, in-process data plane), a tiny GPT, and a job's state filled from the
// synthetic oracle and checked element by element against it.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tenplex/cluster/agent.h"
#include "tenplex/cluster/distributed.h"
#include "tenplex/model/gpt.h"
#include "tenplex/plan/synthetic.h"
#include "tenplex/store/parse.h"
#include "tenplex/store/server.h"

namespace tenplex::cluster::test_hosts {

using nlohmann::json;

inline constexpr uint64_t kSeed = 11;

// The value of the Prometheus series `series` (name and labels) in a metrics text;
// ~0 when the text has none.
inline uint64_t MetricValue(const std::string& metrics, const std::string& series) {
  const std::string key = series + " ";
  const std::size_t at = metrics.find(key);
  if (at == std::string::npos) return ~uint64_t{0};
  return std::stoull(metrics.substr(at + key.size()));
}

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

inline Model TinyGpt() {
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

class HostsFixture : public ::testing::Test {
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

  // Version 1 of job "j" in `config` on the hosts of `cluster`, from the oracle; its
  // info records `placement` (default: the cluster itself).
  void Load(const Cluster& cluster, const std::string& config,
            const std::optional<Cluster>& placement = std::nullopt) {
    Write(cluster, config, 1, placement);
    for (const std::string& u : cluster.hosts) ASSERT_TRUE(StoreOf(u)->Commit("j", 1).ok());
  }

  // Begins `version` of job "j" on the hosts of `cluster` and writes their ranks of
  // `config` into it from the oracle (not prepared, not committed).
  void Write(const Cluster& cluster, const std::string& config, uint64_t version,
             const std::optional<Cluster>& placement = std::nullopt) {
    ParallelConfig cfg = *ParseConfig(config);
    Layout layout = *MakeLayout(model_, cfg);
    json info = {{"model", json::parse(ModelToJson(model_))},
                 {"config", cfg.ToString()},
                 {"cluster", ClusterJson(placement.value_or(cluster))}};
    for (std::size_t h = 0; h < cluster.hosts.size(); ++h) {
      store::Store& st = *StoreOf(cluster.hosts[h]);
      Result<uint64_t> b = st.BeginVersion("j", version, info.dump());
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      for (const RankLayout& r : layout.ranks) {
        if (cluster.HostOfRank(r.rank) != static_cast<int>(h)) continue;
        for (const LocalTensor& t : *r.tensors) {
          Result<store::TensorWriter> w =
              st.Allocate(store::TensorPathOf("j", version, r.rank, t.name), t.dtype, t.shape);
          ASSERT_TRUE(w.ok()) << w.status().ToString();
          ASSERT_TRUE(plan::FillSynthetic(layout, t, kSeed, w->data()).ok());
        }
      }
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
          Result<store::TensorRef> ref =
              st.Get(store::TensorPathOf("j", s.to_version, r.rank, t.name));
          ASSERT_TRUE(ref.ok()) << ref.status().ToString();
          Status c = plan::CheckSynthetic(layout, t, kSeed, ref->data());
          EXPECT_TRUE(c.ok()) << config << " rank " << r.rank << ": " << c.ToString();
        }
      }
      EXPECT_EQ(st.List("jobs/j/" + std::to_string(s.to_version) + "/")->size(), expected)
          << s.new_hosts[h];
    }
    int64_t fetched = 0;
    for (const HostTransformReport& r : s.hosts) fetched += r.prepare.bytes_fetched;
    EXPECT_EQ(fetched, s.plan.bytes_cross_host);
    EXPECT_EQ(s.plan.bytes_cross_host, s.plan.cross_host_lower_bound);
  }

  Model model_;
  std::vector<std::unique_ptr<TestHost>> hosts_;
};

}  // namespace tenplex::cluster::test_hosts
