#include "tenplex/sim/sample.h"

#include <malloc.h>

#include <chrono>
#include <map>
#include <string>

namespace tenplex::sim {
namespace {

std::string Coords(const RankLayout& r, bool zero) {
  return std::to_string(r.tp) + "," + std::to_string(r.pp) + "," +
         std::to_string(zero ? r.dp : -1) + ";";
}

// The kind of each participant (see sample.h), as a key.
std::map<std::string, std::vector<int>> Kinds(const Layout& from, const Layout& to,
                                              const SimResult& r) {
  std::vector<std::string> key(r.hosts.asked);
  for (const RankLayout& o : from.ranks) {
    const int h = r.from_hosts[o.rank];
    if (h >= 0) key[h] += "o" + Coords(o, from.config.zero);
  }
  for (const RankLayout& n : to.ranks) {
    const int h = r.to_hosts[n.rank];
    key[h] += "n" + Coords(n, to.config.zero);
    if (n.rank < from.world_size() && r.from_hosts[n.rank] == h)
      key[h] += "s" + Coords(from.ranks[n.rank], from.config.zero);
  }
  std::map<std::string, std::vector<int>> kinds;
  for (int h : r.hosts.participants) kinds[key[h]].push_back(h);
  return kinds;
}

// Every host of the kind gets the representative's row; sources shifted by the distance.
void Spread(const HostTraffic& rep, int rep_host, const std::vector<int>& members, int n,
            std::vector<HostTraffic>& t) {
  for (int h : members) {
    HostTraffic& x = t[h];
    const int old_ranks = x.old_ranks, new_ranks = x.new_ranks;
    x = rep;
    x.old_ranks = old_ranks;
    x.new_ranks = new_ranks;
    x.bytes_out = 0;
    x.peers_out = 0;
    for (int& s : x.sources) s = ((s + h - rep_host) % n + n) % n;
  }
}

}  // namespace

int64_t HeapBytes() {
  const struct mallinfo2 mi = ::mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

Status SampleHosts(const Model& model, const Layout& from, const Layout& to, int max_kinds,
                   SimResult& r) {
  const std::map<std::string, std::vector<int>> kinds = Kinds(from, to, r);
  if (static_cast<int>(kinds.size()) > max_kinds) {
    return InvalidArgument(
        "simulate: " + std::to_string(kinds.size()) +
        " kinds of hosts to sample (more than sim.max_kinds = " + std::to_string(max_kinds) +
        "; ZeRO-1 makes every dp rank its own kind): use sim.mode \"full\"");
  }
  const int n = r.hosts.asked;
  r.traffic.assign(n, HostTraffic{});
  for (int rank = 0; rank < r.from_ranks; ++rank)
    if (r.from_hosts[rank] >= 0) ++r.traffic[r.from_hosts[rank]].old_ranks;
  for (int rank = 0; rank < r.to_ranks; ++rank) ++r.traffic[r.to_hosts[rank]].new_ranks;
  r.plan = {};
  int64_t total_in = 0, total_peers = 0;
  for (const auto& [key, members] : kinds) {
    const int rep = members.front();
    const int64_t heap0 = HeapBytes();
    const auto t0 = std::chrono::steady_clock::now();
    TP_ASSIGN_OR_RETURN(plan::Plan p,
                        plan::MakeHostPlan(model, from, to, r.from_hosts, r.to_hosts, rep));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (secs > r.costs.plan_s) {
      r.costs.plan_s = secs;
      r.costs.plan_heap = std::max<int64_t>(0, HeapBytes() - heap0);
    }
    const std::vector<HostTraffic> t =
        CountTraffic(p, from, to, r.from_hosts, r.to_hosts, n, /*only_host=*/rep);
    Spread(t[rep], rep, members, n, r.traffic);
    const int64_t k = static_cast<int64_t>(members.size());
    total_in += k * t[rep].bytes_in;
    total_peers += k * t[rep].peers_in;
    r.plan.bytes_total += k * p.stats.bytes_total;
    r.plan.bytes_in_place += k * p.stats.bytes_in_place;
    r.plan.bytes_host_local += k * p.stats.bytes_host_local;
    r.plan.bytes_cross_host += k * p.stats.bytes_cross_host;
    r.plan.cross_host_lower_bound += k * p.stats.cross_host_lower_bound;
    r.plan.ops += k * p.stats.ops;
    r.plan.cross_host_ops += k * p.stats.cross_host_ops;
  }
  int senders = 0;
  for (const HostTraffic& x : r.traffic) senders += x.old_ranks > 0 ? 1 : 0;
  for (HostTraffic& x : r.traffic) {
    if (x.old_ranks == 0 || senders == 0) continue;
    x.bytes_out = total_in / senders;
    x.peers_out = static_cast<int>(total_peers / senders);
  }
  r.sampled_kinds = static_cast<int>(kinds.size());
  r.mode = "sample";
  return Status::Ok();
}

}  // namespace tenplex::sim
