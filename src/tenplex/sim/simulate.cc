// Simulate: placement, the real planner and the measured costs (simulate.h).
#include "tenplex/sim/simulate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "tenplex/cluster/control_protocol.h"
#include "tenplex/io/state_info.h"
#include "tenplex/sim/sample.h"
#include "tenplex/transport/protocol.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::sim {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds of the fastest of the calls of f made in about 50 ms (at least two, at most 50):
// the cost on an unloaded host, as benchmarks count it (a shared machine inflates means).
double TimeIt(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  double best = 1e30;
  for (int n = 0; n < 50 && (n < 2 || Since(t0) < 0.05); ++n) {
    const auto t = Clock::now();
    f();
    best = std::min(best, Since(t));
  }
  return best;
}

// Rank -> host for both layouts and who takes part (scenario.h: placement).
Status Place(const Scenario& s, int from_world, int to_world, SimResult& r) {
  const int kf = s.from_gpus_per_host, kt = s.to_gpus_per_host;
  const int old_hosts = (from_world + kf - 1) / kf;
  const int needed = (to_world + kt - 1) / kt;
  std::set<int> lost(s.cluster.lost_hosts.begin(), s.cluster.lost_hosts.end());
  int target = s.to_hosts;
  if (target == 0) {  // the old hosts, and more if the new config needs them
    target = old_hosts;
    while (target - static_cast<int>(std::count_if(lost.begin(), lost.end(),
                                                   [&](int h) { return h < target; })) <
           needed) {
      ++target;
    }
  }
  const int all = std::max(old_hosts, target);
  for (int h : lost) {
    if (h >= all) {
      return InvalidArgument("cluster.lost_hosts: host " + std::to_string(h) +
                             " is not in the cluster (" + std::to_string(all) + " hosts)");
    }
  }
  if (s.cluster.straggler.size() > static_cast<std::size_t>(all)) {
    return InvalidArgument("cluster.stragglers: host " +
                           std::to_string(s.cluster.straggler.size() - 1) +
                           " is not in the cluster (" + std::to_string(all) + " hosts)");
  }
  std::vector<int> live;
  for (int h = 0; h < target; ++h) {
    if (!lost.count(h)) live.push_back(h);
  }
  if (static_cast<int>(live.size()) < needed) {
    return InvalidArgument("config " + s.to.ToString() + " has " + std::to_string(to_world) +
                           " ranks but the live hosts of the target cluster have " +
                           std::to_string(live.size()) + " x " + std::to_string(kt) + " slots");
  }
  r.from_hosts.resize(from_world);
  for (int rank = 0; rank < from_world; ++rank)
    r.from_hosts[rank] = lost.count(rank / kf) ? plan::kLostHost : rank / kf;
  r.to_hosts.resize(to_world);
  for (int rank = 0; rank < to_world; ++rank) r.to_hosts[rank] = live[rank / kt];
  r.hosts.asked = all;
  r.hosts.lost = static_cast<int>(lost.size());
  r.hosts.participants.assign(live.begin(), live.begin() + needed);
  return Status::Ok();
}

// A cluster of `n` hosts as the coordinator records it: URLs and host ids of real lengths.
io::Cluster NamedCluster(int n, int k) {
  io::Cluster c;
  c.gpus_per_host = k;
  char buf[64];
  for (int h = 0; h < n; ++h) {
    std::snprintf(buf, sizeof buf, "http://node%05d.cluster.internal:7070", h);
    c.hosts.push_back(buf);
    std::snprintf(buf, sizeof buf, "%016x", 0x5a17u * static_cast<unsigned>(h + 1));
    c.host_ids.push_back(buf);
  }
  return c;
}

// The prepare request the coordinator sends to a participant of this transform, at its
// real size: both infos, every host's data-plane address (a UCX worker address of 256
// bytes) and same-host offer, both host maps, and a host's part: its plan digest and the
// tensors peers read from it.
cluster::PrepareRequest MakeRequest(const Model& model, const Scenario& s, const SimResult& r,
                                    int host, const cluster::HostPart& part,
                                    std::string* info_text) {
  const io::Cluster all = NamedCluster(r.hosts.asked, s.from_gpus_per_host);
  io::StateInfo info = io::StateInfo::Make(model, s.from);
  io::Cluster old = all;
  old.hosts.resize((r.from_ranks + s.from_gpus_per_host - 1) / s.from_gpus_per_host);
  old.host_ids.resize(old.hosts.size());
  info.set_placement(old);
  cluster::PrepareRequest q;
  q.job = "job";
  q.from_version = 1;
  q.to_version = 2;
  q.host = host;
  q.info = info.ToJson();
  *info_text = q.info;
  info.set_config(s.to);
  io::Cluster neu;
  neu.gpus_per_host = s.to_gpus_per_host;
  for (int h : r.hosts.participants) {
    neu.hosts.push_back(all.hosts[h]);
    neu.host_ids.push_back(all.host_ids[h]);
  }
  info.set_placement(neu);
  q.new_info = info.ToJson();
  q.to_config = s.to;
  const std::string payload(256, '\x5a');
  for (int h = 0; h < r.hosts.asked; ++h) {
    q.addresses.push_back(transport::EncodeAddress("ucx", payload));
    q.local_peers.push_back({all.hosts[h], all.host_ids[h], "/dev/shm/tenplex", all.host_ids[h]});
  }
  q.from_hosts = r.from_hosts;
  q.to_hosts = r.to_hosts;
  q.host_plan_digest = part.plan_digest;
  q.served = part.served;
  return q;
}

// Whether the coordinator's threads differ from this machine's (that can be fitted): its
// plan and digests are then measured on one thread too.
bool Fitted(const Scenario& s, const MeasuredCosts& c) {
  const int want = s.cluster.coordinator_threads;
  return want > 0 && want != c.threads && c.threads > 1;
}

// A time measured on this machine's threads (`here`) and, when Fitted, on one (`one`),
// on the coordinator's threads: serial + parallel / threads (simulate.h).
double OnCoordinator(const Scenario& s, const MeasuredCosts& c, double here, double one) {
  if (!Fitted(s, c)) return here;
  const double n = c.threads;
  const double parallel = std::clamp((one - here) * n / (n - 1), 0.0, one);
  return (one - parallel) + parallel / s.cluster.coordinator_threads;
}

// For the fit (Fitted): `seconds(threads)` on one thread and on this machine's, alternated
// (1, here, 1, here), the fastest of each kept in one and here (with what they hold if
// positive). Alternating keeps a drift of the machine from favouring either.
Status AlternateThreads(int threads, const std::function<Result<double>(int)>& seconds,
                        double& here, double& one) {
  for (int k = 0; k < 4; ++k) {
    const int t = k % 2 == 0 ? 1 : threads;
    TP_ASSIGN_OR_RETURN(const double secs, seconds(t));
    double& best = t == 1 ? one : here;
    best = best > 0 ? std::min(best, secs) : secs;
  }
  return Status::Ok();
}

// The coordinator's digests, request encoding and decoding, JSON parse rate: the real
// code, timed. The digests are every host's part (cluster::HostPlanParts); the request
// measured is the one of the participant with the most tensors served (the longest).
// p null (sampled hosts): no digests are measured (a placeholder digest, nothing served).
Status MeasureControl(const Model& model, const Scenario& s, const plan::Plan* p, SimResult& r) {
  cluster::HostPart part{std::string(16, '0'), {}};
  int host = r.hosts.participants.empty() ? 0 : r.hosts.participants[0];
  if (p != nullptr) {
    std::vector<cluster::HostPart> parts;
    auto digest = [&](int threads) {
      return TimeIt([&] {
        parts = cluster::HostPlanParts(*p, r.from_hosts, r.to_hosts, r.hosts.asked, threads);
      });
    };
    r.costs.digest_here_s = digest(r.costs.threads);
    if (Fitted(s, r.costs)) {
      TP_RETURN_IF_ERROR(AlternateThreads(
          r.costs.threads, [&](int t) -> Result<double> { return digest(t); },
          r.costs.digest_here_s, r.costs.digest_one_s));
    }
    r.costs.digest_s = OnCoordinator(s, r.costs, r.costs.digest_here_s, r.costs.digest_one_s);
    const std::vector<int>& hosts = r.hosts.participants;
    auto longest = std::max_element(hosts.begin(), hosts.end(), [&](int x, int y) {
      return parts[x].served.size() < parts[y].served.size();
    });
    if (longest != hosts.end()) {
      host = *longest;
      part = std::move(parts[host]);
    }
  }
  std::string info_text;
  const cluster::PrepareRequest q = MakeRequest(model, s, r, host, part, &info_text);
  std::string body;
  r.costs.encode_s = TimeIt([&] { body = cluster::EncodePrepare(q); });
  r.costs.request_bytes = static_cast<int64_t>(body.size());
  r.costs.info_bytes = static_cast<int64_t>(info_text.size());
  Status decoded = Status::Ok();
  r.costs.decode_s = TimeIt([&] {
    auto d = cluster::DecodePrepare(body);
    if (!d.ok()) decoded = d.status();
  });
  if (!decoded.ok()) return decoded.WithContext("simulate: the modelled prepare request");
  std::size_t parsed = 0;
  const double parse_s =
      TimeIt([&] { parsed += nlohmann::json::parse(info_text, nullptr, false).size(); });
  r.costs.json_s_per_byte = info_text.empty() ? 0 : parse_s / static_cast<double>(info_text.size());
  return Status::Ok();
}

// For the fit (Fitted): the whole plan on one thread and on this machine's
// (AlternateThreads: plan_one_s, plan_here_s), after an untimed one: on this VM the first
// touch of memory costs up to 8x a later one (docs/scale.md), which would favour whichever
// plan runs later.
Status TimePlanThreads(const Model& model, const Layout& from, const Layout& to, SimResult& r) {
  auto plan = [&](int threads) -> Result<double> {
    const auto t0 = Clock::now();
    TP_RETURN_IF_ERROR(plan::MakePlan(model, from, to, r.from_hosts, r.to_hosts, threads).status());
    return Since(t0);
  };
  TP_RETURN_IF_ERROR(plan(r.costs.threads).status());
  return AlternateThreads(r.costs.threads, plan, r.costs.plan_here_s, r.costs.plan_one_s);
}

// The full plan (what the coordinator and every agent compute), its bytes per host and
// costs, the prediction, and the critical host's per-host plan for comparison.
Status SimulateFull(const Model& model, const Scenario& s, const Layout& from, const Layout& to,
                    SimResult& r) {
  r.mode = "full";
  r.costs.threads = HardwareThreads();
  if (Fitted(s, r.costs)) TP_RETURN_IF_ERROR(TimePlanThreads(model, from, to, r));
  const int64_t heap0 = HeapBytes();
  const auto t0 = Clock::now();
  TP_ASSIGN_OR_RETURN(plan::Plan p,
                      plan::MakePlan(model, from, to, r.from_hosts, r.to_hosts, r.costs.threads));
  r.costs.plan_here_s =
      r.costs.plan_here_s > 0 ? std::min(r.costs.plan_here_s, Since(t0)) : Since(t0);
  r.costs.plan_heap = std::max<int64_t>(0, HeapBytes() - heap0);
  r.costs.plan_s = OnCoordinator(s, r.costs, r.costs.plan_here_s, r.costs.plan_one_s);
  r.plan = p.stats;
  r.traffic = CountTraffic(p, from, to, r.from_hosts, r.to_hosts, r.hosts.asked);
  TP_RETURN_IF_ERROR(MeasureControl(model, s, &p, r));
  // The critical host without the agents' plans, whose per-host plan then stands for
  // every agent's (each plans its own part, agent_plan.h).
  r.prediction = Predict(r.traffic, r.hosts, s.cluster, r.costs);
  p = {};  // freed before the per-host plan is measured
  const int critical = r.prediction.critical_host;
  if (critical < 0) return Status::Ok();
  const int64_t heap1 = HeapBytes();
  const auto t1 = Clock::now();
  TP_ASSIGN_OR_RETURN(plan::Plan hp,
                      plan::MakeHostPlan(model, from, to, r.from_hosts, r.to_hosts, critical));
  r.costs.host_plan_s = Since(t1);
  r.costs.host_plan_heap = std::max<int64_t>(0, HeapBytes() - heap1);
  if (hp.stats.bytes_cross_host != r.traffic[critical].bytes_in) {
    return Internal("simulate: the per-host plan of host " + std::to_string(critical) +
                    " receives " + std::to_string(hp.stats.bytes_cross_host) +
                    " bytes but the full plan sends it " +
                    std::to_string(r.traffic[critical].bytes_in));
  }
  r.prediction = Predict(r.traffic, r.hosts, s.cluster, r.costs);
  return Status::Ok();
}

}  // namespace

Result<SimResult> Simulate(const Scenario& s) {
  TP_ASSIGN_OR_RETURN(Model model, ResolveModel(s));
  auto from = MakeLayout(model, s.from);
  if (!from.ok()) return from.status().WithContext("from " + s.from.ToString());
  auto to = MakeLayout(model, s.to);
  if (!to.ok()) return to.status().WithContext("to " + s.to.ToString());
  SimResult r;
  r.model = model.name;
  r.from_config = s.from.ToString();
  r.to_config = s.to.ToString();
  r.from_ranks = from->world_size();
  r.to_ranks = to->world_size();
  r.cluster = s.cluster;
  TP_RETURN_IF_ERROR(Place(s, r.from_ranks, r.to_ranks, r));
  if (s.mode == SimMode::kSample ||
      (s.mode == SimMode::kAuto && r.from_ranks + r.to_ranks > s.full_max_ranks)) {
    // Per-host plans of one host per kind; the full plan and its digest are not computed.
    TP_RETURN_IF_ERROR(SampleHosts(model, *from, *to, s.max_kinds, r));
    TP_RETURN_IF_ERROR(MeasureControl(model, s, nullptr, r));
    r.costs.host_plan_s = r.costs.plan_s;
    r.costs.host_plan_heap = r.costs.plan_heap;
    r.prediction = Predict(r.traffic, r.hosts, s.cluster, r.costs);
  } else {
    TP_RETURN_IF_ERROR(SimulateFull(model, s, *from, *to, r));
  }
  for (const RankLayout& rank : to->ranks) r.checkpoint_bytes += rank.bytes();
  r.state_bytes = GlobalBytes(model);
  if (s.cluster.pfs_gbyte_s > 0) {
    r.checkpoint_s = static_cast<double>(r.checkpoint_bytes) / (s.cluster.pfs_gbyte_s * 1e9);
    r.state_s = static_cast<double>(r.state_bytes) / (s.cluster.pfs_gbyte_s * 1e9);
  }
  return r;
}

}  // namespace tenplex::sim
