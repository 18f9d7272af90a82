// What each host moves in a transform, counted from the planner's plan (no model of
// its own): the same split of a host's ops that the executor makes (host_exec.h).
#pragma once

#include <cstdint>
#include <vector>

#include "tenplex/plan/planner.h"
#include "tenplex/ptc/layout.h"

namespace tenplex::sim {

struct HostTraffic {
  int old_ranks = 0, new_ranks = 0;
  int64_t bytes_in = 0;      // remote ops into this host (fetched over the data plane)
  int64_t bytes_out = 0;     // remote ops out of this host (served to peers)
  int64_t bytes_kept = 0;    // in place, copied into a new tensor (Plan::kept)
  int64_t bytes_linked = 0;  // whole tensors linked unchanged (no copy, no allocation)
  int64_t bytes_local = 0;   // ops from an old rank of this host
  int64_t bytes_landed = 0;  // ops from a new tensor of this host an earlier op filled
  int64_t bytes_new = 0;     // new tensors allocated (all of this host's but the linked)
  int64_t remote_ops = 0;    // remote ops into this host
  int peers_in = 0;          // hosts it fetches from (one Fetch request each)
  std::vector<int> sources;  // those hosts, ascending
  int peers_out = 0;         // hosts it serves
};

// Per host (index = host, num_hosts of them) for `plan` between the layouts. The plan
// may be a per-host plan (plan::MakeHostPlan) of host only_host: then only that host's
// row is complete (and the other hosts' bytes_out count what they send to it).
std::vector<HostTraffic> CountTraffic(const plan::Plan& plan, const Layout& from, const Layout& to,
                                      const std::vector<int>& from_hosts,
                                      const std::vector<int>& to_hosts, int num_hosts,
                                      int only_host = -1);

}  // namespace tenplex::sim
