// SimResultToJson and SimSummary (simulate.h).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tenplex/sim/simulate.h"
#include "tenplex/util/format.h"

namespace tenplex::sim {
namespace {

using nlohmann::json;

json HostJson(const SimResult& r, int h) {
  const HostTraffic& t = r.traffic[h];
  const HostTimes& p = r.prediction.hosts[h];
  return {{"host", h},
          {"old_ranks", t.old_ranks},
          {"new_ranks", t.new_ranks},
          {"lost", std::count(r.cluster.lost_hosts.begin(), r.cluster.lost_hosts.end(), h) > 0},
          {"straggler", r.cluster.Straggler(h)},
          {"bytes_in", t.bytes_in},
          {"bytes_out", t.bytes_out},
          {"bytes_kept", t.bytes_kept},
          {"bytes_linked", t.bytes_linked},
          {"bytes_local", t.bytes_local},
          {"bytes_landed", t.bytes_landed},
          {"bytes_new", t.bytes_new},
          {"remote_ops", t.remote_ops},
          {"peers_in", t.peers_in},
          {"peers_out", t.peers_out},
          {"seconds",
           {{"start", p.start},
            {"decode", p.decode},
            {"plan", p.plan},
            {"warm", p.warm},
            {"alloc", p.alloc},
            {"fetch", p.fetch},
            {"local", p.local},
            {"landed", p.landed},
            {"seal", p.seal},
            {"prepare", p.prepare}}}};
}

}  // namespace

std::string SimResultToJson(const SimResult& r) {
  const Prediction& p = r.prediction;
  json hosts = json::array();
  for (std::size_t h = 0; h < r.traffic.size(); ++h)
    hosts.push_back(HostJson(r, static_cast<int>(h)));
  json out = {{"model", r.model},
              {"from", r.from_config},
              {"to", r.to_config},
              {"from_ranks", r.from_ranks},
              {"to_ranks", r.to_ranks},
              {"hosts_asked", r.hosts.asked},
              {"participants", r.hosts.participants.size()},
              {"lost_hosts", r.cluster.lost_hosts},
              {"coordinator_threads", r.cluster.coordinator_threads},
              {"mode", r.mode},
              {"sampled_kinds", r.sampled_kinds},
              {"plan",
               {{"bytes_total", r.plan.bytes_total},
                {"bytes_in_place", r.plan.bytes_in_place},
                {"bytes_host_local", r.plan.bytes_host_local},
                {"bytes_cross_host", r.plan.bytes_cross_host},
                {"cross_host_lower_bound", r.plan.cross_host_lower_bound},
                {"ops", r.plan.ops},
                {"cross_host_ops", r.plan.cross_host_ops}}},
              {"measured",
               {{"plan_seconds", r.costs.plan_s},
                {"plan_heap_bytes", r.costs.plan_heap},
                {"digest_seconds", r.costs.digest_s},
                {"threads_here", r.costs.threads},
                {"plan_seconds_here", r.costs.plan_here_s},
                {"plan_seconds_one_thread", r.costs.plan_one_s},
                {"digest_seconds_here", r.costs.digest_here_s},
                {"digest_seconds_one_thread", r.costs.digest_one_s},
                {"encode_seconds", r.costs.encode_s},
                {"decode_seconds", r.costs.decode_s},
                {"request_bytes", r.costs.request_bytes},
                {"info_bytes", r.costs.info_bytes},
                {"json_seconds_per_byte", r.costs.json_s_per_byte},
                {"critical_host_plan_seconds", r.costs.host_plan_s},
                {"critical_host_plan_heap_bytes", r.costs.host_plan_heap}}},
              {"prediction",
               {{"control_seconds", p.control},
                {"coordinator_plan_seconds", p.coordinator_plan},
                {"prepare_round_seconds", p.round},
                {"commit_seconds", p.commit},
                {"release_seconds", p.release},
                {"total_seconds", p.total},
                {"critical_host", p.critical_host}}},
              {"checkpoint_restart",
               {{"bytes", r.checkpoint_bytes},
                {"pfs_gbyte_s", r.cluster.pfs_gbyte_s},
                {"read_seconds", r.checkpoint_s},
                {"state_bytes", r.state_bytes},
                {"state_read_seconds", r.state_s}}},
              {"hosts", hosts}};
  return out.dump(1) + "\n";
}

std::string SimSummary(const SimResult& r) {
  const Prediction& p = r.prediction;
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line,
                "simulate %s: %s (%d ranks) -> %s (%d ranks), %d hosts asked, %zu take part%s\n",
                r.model.c_str(), r.from_config.c_str(), r.from_ranks, r.to_config.c_str(),
                r.to_ranks, r.hosts.asked, r.hosts.participants.size(),
                r.hosts.lost > 0 ? (", " + std::to_string(r.hosts.lost) + " lost").c_str() : "");
  s += line;
  std::snprintf(line, sizeof line,
                "plan (measured, %s mode): %.3f s, %s of heap, %lld ops; cross-host %s (lower "
                "bound %s), in place %s\n",
                r.mode.c_str(), r.costs.plan_s, HumanBytes(r.costs.plan_heap).c_str(),
                static_cast<long long>(r.plan.ops), HumanBytes(r.plan.bytes_cross_host).c_str(),
                HumanBytes(r.plan.cross_host_lower_bound).c_str(),
                HumanBytes(r.plan.bytes_in_place).c_str());
  s += line;
  if (r.prediction.critical_host >= 0) {
    std::snprintf(line, sizeof line,
                  "each agent's plan, the critical host's part (plan::MakeHostPlan): %.3f s, "
                  "%s of heap\n",
                  r.costs.host_plan_s, HumanBytes(r.costs.host_plan_heap).c_str());
    s += line;
  }
  std::snprintf(line, sizeof line,
                "predicted transform: %.3f s = control %.3f + coordinator plan %.3f + prepare "
                "round %.3f + commit %.3f + release %.3f\n",
                p.total, p.control, p.coordinator_plan, p.round, p.commit, p.release);
  s += line;
  if (p.critical_host >= 0) {
    const HostTimes& h = p.hosts[p.critical_host];
    const HostTraffic& t = r.traffic[p.critical_host];
    std::snprintf(
        line, sizeof line,
        "critical host %d: starts %.3f s, prepare %.3f s (decode %.3f, plan %.3f, warm %.3f, alloc "
        "%.3f, fetch %.3f, local %.3f, landed %.3f, seal %.3f); in %s, out %s\n",
        p.critical_host, h.start, h.prepare, h.decode, h.plan, h.warm, h.alloc, h.fetch, h.local,
        h.landed, h.seal, HumanBytes(t.bytes_in).c_str(), HumanBytes(t.bytes_out).c_str());
    s += line;
  }
  if (r.checkpoint_s > 0) {
    std::snprintf(line, sizeof line,
                  "restart from a checkpoint at %.0f GB/s: every rank reads its shards, %s in "
                  "%.3f s; the state read once, %s in %.3f s (the read alone)\n",
                  r.cluster.pfs_gbyte_s, HumanBytes(r.checkpoint_bytes).c_str(), r.checkpoint_s,
                  HumanBytes(r.state_bytes).c_str(), r.state_s);
    s += line;
  }
  return s;
}

}  // namespace tenplex::sim
