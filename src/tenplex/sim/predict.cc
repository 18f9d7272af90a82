// The time model of simulate.h (its formulas, in the same order) and the output.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tenplex/sim/simulate.h"
#include "tenplex/util/format.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::sim {
namespace {

struct Rates {
  double nic, lat, rpc, copy, mem, map, hash, json;  // bytes/s, s, s, bytes/s (4), s/byte
};

Rates RatesOf(const ClusterModel& c, const MeasuredCosts& m) {
  return {c.nic_gbit_s * 1e9 / 8,
          c.latency_us * 1e-6,
          c.rpc_us * 1e-6,
          c.copy_gbyte_s * 1e9,
          c.memory_gbyte_s * 1e9,
          c.map_gbyte_s * 1e9,
          (c.hash_gbyte_s > 0 ? c.hash_gbyte_s : c.memory_gbyte_s) * 1e9,
          c.json_gbyte_s > 0 ? 1 / (c.json_gbyte_s * 1e9) : m.json_s_per_byte};
}

// Seconds until the last of host h's sources has served everything it serves.
double SlowestSource(const std::vector<HostTraffic>& t, const std::vector<int>& sources,
                     const ClusterModel& c) {
  double worst = 0;
  for (int x : sources)
    worst = std::max(worst, static_cast<double>(t[x].bytes_out) * c.Straggler(x));
  return worst;
}

HostTimes HostPrepare(const std::vector<HostTraffic>& t, int h, const ClusterModel& c,
                      const MeasuredCosts& m, const Rates& r) {
  const HostTraffic& x = t[h];
  const double s = c.Straggler(h);
  HostTimes ht;
  ht.decode = m.decode_s * s;
  ht.plan = m.host_plan_s * s;
  ht.warm = x.bytes_out / r.map * s;
  ht.alloc = c.presized ? 0 : x.bytes_new / r.mem * s;
  if (x.bytes_in > 0) {
    const double wire =
        std::max(static_cast<double>(x.bytes_in) * s, SlowestSource(t, x.sources, c)) / r.nic;
    ht.fetch = wire + r.rpc * (x.peers_in + x.peers_out) * s + 2 * r.lat;
  }
  ht.local = (x.bytes_kept + x.bytes_local) / r.copy * s;
  ht.landed = x.bytes_landed / r.copy * s;
  ht.seal = x.bytes_new / r.hash * s;
  ht.prepare =
      ht.decode + ht.plan + ht.warm + ht.alloc + std::max(ht.fetch, ht.local) + ht.landed + ht.seal;
  return ht;
}

}  // namespace

Prediction Predict(const std::vector<HostTraffic>& traffic, const SimHosts& hosts,
                   const ClusterModel& c, const MeasuredCosts& m) {
  const Rates r = RatesOf(c, m);
  Prediction p;
  p.hosts.resize(traffic.size());
  const double rt = r.rpc + 2 * r.lat;  // one request's round trip
  // Rounds of kControlConcurrency requests in flight (ForEachConcurrently).
  auto rounds = [](int64_t n) {
    const auto k = static_cast<int64_t>(kControlConcurrency);
    return static_cast<double>((std::max<int64_t>(n, 0) + k - 1) / k);
  };
  const double info = static_cast<double>(m.info_bytes);
  const int64_t n = hosts.asked;
  p.control = rt * (3 * rounds(n) + 1 + rounds(n - 1)) + rounds(n) * info * r.json +
              (rt + info / r.nic + info * r.json) + hosts.lost * c.lost_detect_s;
  p.coordinator_plan = m.plan_s + m.digest_s;
  const double per_request = static_cast<double>(m.request_bytes) / r.nic;
  for (std::size_t i = 0; i < hosts.participants.size(); ++i) {
    const int h = hosts.participants[i];
    HostTimes ht = HostPrepare(traffic, h, c, m, r);
    ht.start = m.encode_s + static_cast<double>(i + 1) * per_request + r.lat + r.rpc;
    const double end = ht.start + ht.prepare + r.lat;
    if (end > p.round) {
      p.round = end;
      p.critical_host = h;
    }
    p.hosts[h] = ht;
  }
  const auto parts = static_cast<int64_t>(hosts.participants.size());
  p.commit = parts == 0 ? 0 : rt * (1 + rounds(parts - 1));
  p.release = rt * (rounds(parts) + rounds(n));
  p.total = p.control + p.coordinator_plan + p.round + p.commit + p.release;
  return p;
}

}  // namespace tenplex::sim
