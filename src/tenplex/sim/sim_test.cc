// The simulator (issue 36): bytes against a hand count, the time formulas against
// hand-computed values, the bytes against the planner's own statistics and the agents'
// link decision, the lost-host re-plan, and bad scenarios.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "tenplex/plan/planner_testing.h"
#include "tenplex/sim/scenario.h"
#include "tenplex/sim/simulate.h"
#include "tenplex/transform/store_tensors.h"

namespace tenplex::sim {
namespace {

// One layer: w F32 [8, 4] split by rows over tp, b F32 [4] replicated; no optimizer.
constexpr const char* kTinyModel =
    R"({"format": "tenplex.model.v1", "name": "tiny", "num_layers": 1,
  "tensors": [{"path": "decoder.layers.0.w", "dtype": "F32", "shape": [8, 4],
               "tp": {"rule": "split", "dim": 0}, "stage": {"layer": 0}},
              {"path": "decoder.layers.0.b", "dtype": "F32", "shape": [4],
               "tp": {"rule": "replicate"}, "stage": {"layer": 0}}]})";

std::string TinyScenario(const std::string& cluster) {
  return std::string(R"({"model": )") + kTinyModel +
         R"(, "from": {"config": "tp=2", "gpus_per_host": 1},
              "to": {"config": "tp=1,dp=2", "gpus_per_host": 1}, "cluster": )" +
         cluster + "}";
}

// tp=2 on 2 hosts (one GPU each) -> tp=1,dp=2. Old rank 0 holds w rows 0-3 (64 bytes)
// and b (16), old rank 1 rows 4-7 and b. Each new rank needs all of w (128) and b.
// Host 0: rows 0-3 stay at the same offsets (kept, 64), rows 4-7 come from host 1 (64);
// b is the same tensor on the same device (linked, 16). Host 1: rows 0-3 come from host
// 0 (64), rows 4-7 move from local offset 0 to 4 (a local copy, 64); b linked.
TEST(Simulate, TinyTpChangeBytesByHand) {
  auto s = ParseScenario(TinyScenario("{}"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto r = Simulate(*s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->traffic.size(), 2u);
  const HostTraffic& h0 = r->traffic[0];
  const HostTraffic& h1 = r->traffic[1];
  EXPECT_EQ(h0.bytes_in, 64);
  EXPECT_EQ(h0.bytes_out, 64);
  EXPECT_EQ(h0.bytes_kept, 64);
  EXPECT_EQ(h0.bytes_local, 0);
  EXPECT_EQ(h0.bytes_linked, 16);
  EXPECT_EQ(h0.bytes_new, 128);
  EXPECT_EQ(h1.bytes_in, 64);
  EXPECT_EQ(h1.bytes_out, 64);
  EXPECT_EQ(h1.bytes_kept, 0);
  EXPECT_EQ(h1.bytes_local, 64);
  EXPECT_EQ(h1.bytes_linked, 16);
  EXPECT_EQ(h1.bytes_new, 128);
  for (const HostTraffic& h : r->traffic) {
    EXPECT_EQ(h.peers_in, 1);
    EXPECT_EQ(h.peers_out, 1);
    EXPECT_EQ(h.bytes_landed, 0);
  }
  EXPECT_EQ(r->hosts.asked, 2);
  EXPECT_EQ(r->hosts.participants, (std::vector<int>{0, 1}));
  EXPECT_GT(r->costs.request_bytes, 0);
  EXPECT_GT(r->costs.info_bytes, 0);
}

// The formulas of simulate.h with round numbers: B = copy = memory = map = 1000 bytes/s,
// L = 1 ms, R = 2 ms, and fixed measured costs.
TEST(Simulate, TimeFormulasByHand) {
  auto s = ParseScenario(TinyScenario(
      R"({"nic_gbit_s": 8e-6, "copy_gbyte_s": 1e-6, "memory_gbyte_s": 1e-6,
          "map_gbyte_s": 1e-6, "latency_us": 1000, "rpc_us": 2000})"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto r = Simulate(*s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  MeasuredCosts m;
  m.plan_s = 0.7;       // the coordinator's whole plan
  m.host_plan_s = 0.5;  // each agent's own part
  m.digest_s = 0.05;
  m.decode_s = 0.1;
  m.encode_s = 0.01;
  m.request_bytes = 1000;
  m.info_bytes = 100;
  m.json_s_per_byte = 1e-3;
  Prediction p = Predict(r->traffic, r->hosts, s->cluster, m);
  // Host 0: decode .1 + plan .5 + warm 64/1000 + alloc 128/1000
  //   + max(fetch 64/1000 + 2 ms x 2 peers + 2 ms, local 64/1000) + seal 128/1000 = 0.990.
  EXPECT_NEAR(p.hosts[0].fetch, 0.070, 1e-9);
  EXPECT_NEAR(p.hosts[0].local, 0.064, 1e-9);
  EXPECT_NEAR(p.hosts[0].prepare, 0.990, 1e-9);
  EXPECT_NEAR(p.hosts[1].prepare, 0.990, 1e-9);
  // Encoded once (0.01), then the copies leave the NIC one after the other (1000/1000
  // each), then L + R.
  EXPECT_NEAR(p.hosts[0].start, 1.013, 1e-9);
  EXPECT_NEAR(p.hosts[1].start, 2.013, 1e-9);
  EXPECT_NEAR(p.round, 2.013 + 0.990 + 0.001, 1e-9);
  EXPECT_EQ(p.critical_host, 1);
  // control, rt = 2 + 2 ms, 2 hosts (one round each): connect, lease (first, rest),
  // listing, address = 5 rt; the daemons digest their info (100 bytes x 1 ms); the
  // coordinator fetches it once: rt + 100/1000 + 100 x 1 ms.
  EXPECT_NEAR(p.control, 0.020 + 0.1 + 0.204, 1e-9);
  EXPECT_NEAR(p.coordinator_plan, 0.75, 1e-9);
  // Commit: the first participant, then the other: 2 rt.
  EXPECT_NEAR(p.commit, 0.008, 1e-9);
  // Release: the old versions on 2 participants (one round), the lease on 2 hosts (one).
  EXPECT_NEAR(p.release, 0.008, 1e-9);
  EXPECT_NEAR(p.total, 0.324 + 0.75 + 3.004 + 0.008 + 0.008, 1e-9);

  // 130 hosts asked, none with new ranks: 3 rounds of 64 per step; the lease's first
  // host alone, then 129 more in 3 rounds: rt x (3 x 3 + 1 + 3) + 3 x 0.1 + 0.204.
  SimHosts many;
  many.asked = 130;
  const Prediction q = Predict(std::vector<HostTraffic>(130), many, s->cluster, m);
  EXPECT_NEAR(q.control, 0.004 * 13 + 0.3 + 0.204, 1e-9);
  EXPECT_EQ(q.commit, 0);
  EXPECT_NEAR(q.release, 0.004 * 3, 1e-9);

  // Host 0 twice as slow: its phases double, and host 1 waits for host 0's sending
  // (max(64, 64 x 2) / 1000 + 4 ms + 2 ms), so host 1 stays the critical one.
  ClusterModel slow = s->cluster;
  slow.straggler = {2.0, 1.0};
  p = Predict(r->traffic, r->hosts, slow, m);
  EXPECT_NEAR(p.hosts[0].prepare, 0.2 + 1.0 + 0.128 + 0.256 + 0.138 + 0.256, 1e-9);
  EXPECT_NEAR(p.hosts[1].fetch, 0.134, 1e-9);
  EXPECT_NEAR(p.hosts[1].prepare, 0.1 + 0.5 + 0.064 + 0.128 + 0.134 + 0.128, 1e-9);
  EXPECT_EQ(p.critical_host, 1);

  // Pre-sized pages: no allocation phase, nothing else changes.
  ClusterModel pooled = s->cluster;
  pooled.presized = true;
  p = Predict(r->traffic, r->hosts, pooled, m);
  EXPECT_EQ(p.hosts[0].alloc, 0);
  EXPECT_NEAR(p.hosts[0].prepare, 0.990 - 0.128, 1e-9);

  // A checksum rate of its own (issue 36 validation: xxh64 runs several times faster
  // than first touch): the seal is new / H, 128 / 4000; alloc stays new / M.
  ClusterModel hashed = s->cluster;
  hashed.hash_gbyte_s = 4e-6;
  p = Predict(r->traffic, r->hosts, hashed, m);
  EXPECT_NEAR(p.hosts[0].seal, 0.032, 1e-9);
  EXPECT_NEAR(p.hosts[0].alloc, 0.128, 1e-9);
  EXPECT_NEAR(p.hosts[0].prepare, 0.990 - 0.128 + 0.032, 1e-9);
  auto parsed = ParseScenario(TinyScenario(R"({"hash_gbyte_s": 4})"));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->cluster.hash_gbyte_s, 4);
  EXPECT_FALSE(ParseScenario(TinyScenario(R"({"hash_gbyte_s": -1})")).ok());
}

// The simulator's per-host bytes are the planner's: received and sent bytes equal the
// plan's per-host statistics, local and landed ops its host-local bytes, and the linked
// tensors what each agent's own UnchangedTensors call (its host) returns.
TEST(Simulate, BytesArePlannersOwn) {
  const char* configs[] = {
      "tp=1",      "tp=2",     "tp=4", "tp=2,pp=2", "pp=4", "tp=1,dp=2", "tp=2,dp=2,zero=1",
      "pp=2,dp=3", "tp=4,pp=2"};
  std::mt19937 rng(36);
  const Model model = plan::testing::Tiny(plan::testing::Specs()[0]);  // Adam, 4 groups
  for (int i = 0; i < 40; ++i) {
    const ParallelConfig a = *ParseConfig(configs[rng() % std::size(configs)]);
    const ParallelConfig b = *ParseConfig(configs[rng() % std::size(configs)]);
    const int k = 1 + static_cast<int>(rng() % 3);
    auto from = MakeLayout(model, a);
    auto to = MakeLayout(model, b);
    ASSERT_TRUE(from.ok() && to.ok());
    const std::vector<int> fh = plan::DefaultHosts(from->world_size(), k);
    const std::vector<int> th = plan::DefaultHosts(to->world_size(), k);
    auto p = plan::MakePlan(model, *from, *to, fh, th);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    const int hosts = std::max(fh.back(), th.back()) + 1;
    const std::vector<HostTraffic> t = CountTraffic(*p, *from, *to, fh, th, hosts);
    int64_t in = 0, local = 0;
    for (int h = 0; h < hosts; ++h) {
      SCOPED_TRACE(a.ToString() + " -> " + b.ToString() + ", host " + std::to_string(h));
      if (static_cast<std::size_t>(h) < p->stats.host_recv_bytes.size()) {
        EXPECT_EQ(t[h].bytes_in, p->stats.host_recv_bytes[h]);
        EXPECT_EQ(t[h].bytes_out, p->stats.host_send_bytes[h]);
      }
      int64_t linked = 0;
      for (const auto& [rank, ti] : transform::UnchangedTensors(*from, *to, *p, &fh, &th, h))
        linked += (*to->ranks[rank].tensors)[ti].bytes();
      EXPECT_EQ(t[h].bytes_linked, linked);
      in += t[h].bytes_in;
      local += t[h].bytes_local + t[h].bytes_landed;
    }
    EXPECT_EQ(in, p->stats.bytes_cross_host);
    EXPECT_EQ(in, p->stats.cross_host_lower_bound);
    EXPECT_EQ(local, p->stats.bytes_host_local);
  }
}

std::string GptScenario(const std::string& from, const std::string& to, int k,
                        const std::string& cluster) {
  return R"({"model": "gpt3-125m", "from": {"config": ")" + from + R"(", "gpus_per_host": )" +
         std::to_string(k) + R"(}, "to": {"config": ")" + to + R"(", "gpus_per_host": )" +
         std::to_string(k) + R"(}, "cluster": )" + cluster + "}";
}

// A lost host: its old ranks are plan::kLostHost, it gets no new rank, and the bytes it
// held come from the surviving replicas (the planner's re-plan, as the transform does).
TEST(Simulate, LostHostReplansFromReplicas) {
  auto s = ParseScenario(GptScenario("tp=2,dp=4", "tp=2,dp=3", 2, R"({"lost_hosts": [1]})"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto r = Simulate(*s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hosts.lost, 1);
  EXPECT_EQ(r->hosts.participants, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(r->from_hosts[2], plan::kLostHost);
  EXPECT_EQ(r->from_hosts[3], plan::kLostHost);
  EXPECT_EQ(r->traffic[1].bytes_out, 0);
  EXPECT_EQ(r->traffic[1].new_ranks, 0);
  // New ranks 2-3 (dp rank 1) land on host 2, which holds dp rank 2: the same boxes, so
  // nothing crosses; the same for host 3. The plan is the planner's for these maps.
  EXPECT_EQ(r->plan.bytes_cross_host, 0);
  auto model = ResolveModel(*s);
  ASSERT_TRUE(model.ok());
  auto p = plan::MakePlan(*model, *MakeLayout(*model, s->from), *MakeLayout(*model, s->to),
                          r->from_hosts, r->to_hosts);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(r->plan.bytes_cross_host, p->stats.bytes_cross_host);
  EXPECT_EQ(r->plan.ops, p->stats.ops);

  // One GPU per host, tp=2,dp=2 -> tp=2: host 1 (tp rank 1 of dp rank 0) is lost; new
  // rank 1 (tp rank 1) goes on host 2, which holds tp rank 0 of dp rank 1, and takes its
  // half from host 3, the surviving replica.
  s = ParseScenario(GptScenario("tp=2,dp=2", "tp=2", 1, R"({"lost_hosts": [1]})"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  r = Simulate(*s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hosts.participants, (std::vector<int>{0, 2}));
  EXPECT_EQ(r->traffic[2].sources, (std::vector<int>{3}));
  EXPECT_GT(r->traffic[2].bytes_in, 0);
  EXPECT_EQ(r->traffic[3].bytes_out, r->traffic[2].bytes_in);
  EXPECT_EQ(r->traffic[0].bytes_in, 0);
  EXPECT_EQ(r->traffic[1].bytes_out, 0);

  // Without replicas (dp=1) the state of a lost host is gone: the planner's DataLoss.
  s = ParseScenario(GptScenario("tp=2,pp=2", "tp=2", 2, R"({"lost_hosts": [1]})"));
  ASSERT_TRUE(s.ok());
  r = Simulate(*s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
}

// Sampled hosts (sample.h): one per-host plan per kind of host gives every host exactly
// the bytes the full plan gives it (received, kept, local, landed, linked, new); only
// the sending side is estimated.
TEST(Simulate, SampledHostsHaveTheFullPlansBytes) {
  for (const char* lost : {"[]", "[2]"}) {
    const std::string base = GptScenario("tp=2,pp=2,dp=8", "tp=2,pp=2,dp=6", 4,
                                         std::string(R"({"lost_hosts": )") + lost + "}");
    auto full = ParseScenario(base);
    ASSERT_TRUE(full.ok()) << full.status().ToString();
    full->mode = SimMode::kFull;
    Scenario sampled = *full;
    sampled.mode = SimMode::kSample;
    auto a = Simulate(*full);
    auto b = Simulate(sampled);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
    EXPECT_EQ(a->mode, "full");
    EXPECT_EQ(b->mode, "sample");
    EXPECT_GT(b->sampled_kinds, 1);
    EXPECT_LT(b->sampled_kinds, static_cast<int>(b->hosts.participants.size()));
    EXPECT_EQ(b->plan.bytes_cross_host, a->plan.bytes_cross_host);
    EXPECT_EQ(b->plan.ops, a->plan.ops);
    for (int h : a->hosts.participants) {
      SCOPED_TRACE(std::string("lost ") + lost + ", host " + std::to_string(h));
      const HostTraffic &x = a->traffic[h], &y = b->traffic[h];
      EXPECT_EQ(y.bytes_in, x.bytes_in);
      EXPECT_EQ(y.bytes_kept, x.bytes_kept);
      EXPECT_EQ(y.bytes_local, x.bytes_local);
      EXPECT_EQ(y.bytes_landed, x.bytes_landed);
      EXPECT_EQ(y.bytes_linked, x.bytes_linked);
      EXPECT_EQ(y.bytes_new, x.bytes_new);
    }
  }
  // More kinds than allowed: refused, naming the limit.
  auto s = ParseScenario(GptScenario("tp=2,dp=8,zero=1", "tp=2,dp=4,zero=1", 2, "{}"));
  ASSERT_TRUE(s.ok());
  s->mode = SimMode::kSample;
  s->max_kinds = 2;
  auto r = Simulate(*s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("sim.max_kinds = 2"), std::string::npos)
      << r.status().ToString();
}

// The coordinator's plan and digests on another number of threads than this machine's
// (simulate.h): measured on one thread and on this machine's, and fitted. On one thread
// the fit is the one-thread measurement; on this machine's, this machine's; in between
// and beyond, serial + parallel / threads, between the serial part and both
// measurements. Without coordinator_threads, what was measured here.
TEST(Simulate, CoordinatorThreadsFitTheMeasurements) {
  auto run = [](int threads) {
    std::string cluster =
        threads < 0 ? "{}" : R"({"coordinator_threads": )" + std::to_string(threads) + "}";
    auto s = ParseScenario(GptScenario("tp=2,pp=2,dp=4", "tp=2,pp=2,dp=3", 4, cluster));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    auto r = Simulate(*s);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r->costs;
  };
  const MeasuredCosts as_is = run(-1);
  EXPECT_GE(as_is.threads, 1);
  EXPECT_EQ(as_is.plan_s, as_is.plan_here_s);
  EXPECT_EQ(as_is.digest_s, as_is.digest_here_s);
  EXPECT_EQ(as_is.plan_one_s, 0);
  if (as_is.threads == 1) GTEST_SKIP() << "one hardware thread: nothing to fit against";
  const MeasuredCosts one = run(1);
  EXPECT_GT(one.plan_one_s, 0);
  EXPECT_EQ(one.plan_s, one.plan_one_s);
  EXPECT_EQ(one.digest_s, one.digest_one_s);
  const MeasuredCosts many = run(64);
  EXPECT_GT(many.plan_one_s, 0);
  EXPECT_LE(many.plan_s, std::max(many.plan_here_s, many.plan_one_s) + 1e-12);
  EXPECT_LE(many.digest_s, std::min(many.digest_here_s, many.digest_one_s) + 1e-12);
  EXPECT_GE(many.plan_s, 0);
  const double n = many.threads;
  const double par =
      std::clamp((many.plan_one_s - many.plan_here_s) * n / (n - 1), 0.0, many.plan_one_s);
  EXPECT_NEAR(many.plan_s, many.plan_one_s - par + par / 64, 1e-12);
}

TEST(Scenario, BadInputIsNamed) {
  struct Case {
    std::string text, needle;
  };
  const std::vector<Case> cases = {
      {"{", "not valid JSON"},
      {"[]", "must be a JSON object"},
      {R"({"from": {"config": "tp=1"}, "to": {"config": "tp=1"}})", "needs \"model\""},
      {R"({"model": "gpt3-125m", "to": {"config": "tp=1"}})", "needs \"from\""},
      {R"({"model": "gpt3-125m", "from": {"config": "tp=x"}, "to": {"config": "tp=1"}})",
       "from.config"},
      {R"({"model": "gpt3-125m", "from": {"config": 3}, "to": {"config": "tp=1"}})",
       "from.config must be a config string"},
      {GptScenario("tp=1", "tp=2", 8, R"({"nic_gbit_s": 0})"), "cluster.nic_gbit_s must be > 0"},
      {GptScenario("tp=1", "tp=2", 8, R"({"latency_us": -1})"), "cluster.latency_us"},
      {GptScenario("tp=1", "tp=2", 8, R"({"copy_gbyte_s": "fast"})"), "must be a number"},
      {GptScenario("tp=1", "tp=2", 8, R"({"stragglers": [{"host": 0, "factor": 0.5}]})"),
       "factor must be >= 1"},
      {GptScenario("tp=1", "tp=2", 8, R"({"stragglers": [{"factor": 2}]})"), "has no host"},
      {GptScenario("tp=1", "tp=2", 8, R"({"lost_hosts": [-1]})"), "is not a host index"},
      {GptScenario("tp=1", "tp=2", 8, R"({"coordinator_threads": 1.5})"),
       "cluster.coordinator_threads must be an integer"},
      {GptScenario("tp=1", "tp=2", 8, R"({"coordinator_threads": 5000})"),
       "cluster.coordinator_threads must be in [0, 4096]"},
      {GptScenario("tp=1", "tp=2", 0, "{}"), "from.gpus_per_host must be in [1, 1024]"},
      {GptScenario("tp=1", "tp=2", 8, "{}").substr(0, 10) + "}", "not valid JSON"},
      {R"({"model": "gpt3-125m", "from": {"config": "tp=1"}, "to": {"config": "tp=1"},
          "sim": {"mode": "fast"}})",
       "sim.mode must be"},
  };
  for (const Case& c : cases) {
    auto s = ParseScenario(c.text);
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(s.status().message().find(c.needle), std::string::npos)
        << c.text << " -> " << s.status().ToString();
  }
}

TEST(Scenario, ImpossibleSimulationsFailClearly) {
  struct Case {
    std::string text, needle;
  };
  const std::vector<Case> cases = {
      {GptScenario("tp=1", "tp=5", 8, "{}"), "to tp=5"},  // 12 heads: tp=5 does not divide
      {GptScenario("tp=1", "tp=2", 8, R"({"lost_hosts": [7]})"), "host 7 is not in the cluster"},
      {GptScenario("tp=1", "tp=2", 8, R"({"stragglers": [{"host": 9, "factor": 2}]})"),
       "host 9 is not in the cluster"},
      {R"({"model": "no-such-model", "from": {"config": "tp=1"}, "to": {"config": "tp=1"}})",
       "model"},
      {R"({"model": "gpt3-125m", "from": {"config": "tp=1"}, "to": {"config": "dp=16",
          "gpus_per_host": 8, "hosts": 1}})",
       "16 ranks but the live hosts of the target cluster have 1 x 8 slots"},
  };
  for (const Case& c : cases) {
    auto s = ParseScenario(c.text);
    ASSERT_TRUE(s.ok()) << c.text << ": " << s.status().ToString();
    auto r = Simulate(*s);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << c.text << " -> " << r.status().ToString();
  }
}

}  // namespace
}  // namespace tenplex::sim
