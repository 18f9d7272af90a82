// One host's share of a reconfiguration plan.
//
// Every host computes the same plan (planner.h: deterministic for the same inputs) and
// executes only the ops whose destination rank lives on it. Those ops fall into four
// groups, by where their source is:
//   kept     in place (Plan::kept): the same device holds the element at the same
//            position; the store still writes the new version's tensor, so it is a
//            local copy;
//   local    an old rank on this host (src_layout "old");
//   remote   an old rank on another host: read over the data plane, straight from the
//            peer's shared-memory tensor into this host's new tensor (one Fetch per
//            peer with every box of that peer, all peers at once);
//   landed   a new rank of this host that an earlier remote op filled (src_layout
//            "new", the planner's host deduplication): copied after the fetches.
// Local copies run on this thread and the pool while the fetches are in flight, so the
// host's time is max(local, fetch) + landed rather than their sum.
//
// Because every element a host needs and does not hold crosses into it exactly once
// (the planner's lower-bound property), the bytes fetched by all hosts together equal
// the plan's cross-host bytes, and no host reads anything it already has.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tenplex/plan/planner.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/transport/transport.h"
#include "tenplex/util/status.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::transform {

struct HostExecStats {
  int64_t bytes_kept = 0;     // in-place regions copied into the new tensors
  int64_t bytes_linked = 0;   // in-place regions of linked tensors (no copy)
  int64_t bytes_local = 0;    // local and landed ops
  int64_t bytes_fetched = 0;  // remote ops (payload bytes)
  int64_t remote_ops = 0;
  int peers = 0;             // hosts fetched from
  double local_seconds = 0;  // kept + local copies (overlapping the fetches)
  double fetch_seconds = 0;  // until the last peer's Fetch returned
  double landed_seconds = 0;
};

struct HostExecInput {
  const plan::Plan* plan = nullptr;
  const Layout* from = nullptr;
  const Layout* to = nullptr;
  const std::vector<int>* from_hosts = nullptr;  // plan::kLostHost allowed
  const std::vector<int>* to_hosts = nullptr;
  int host = 0;
  // src[r][i]: old rank r's local tensor i, for the old ranks on this host (others may
  // be empty); dst[r][i]: new rank r's local tensor i, for the new ranks on this host.
  const std::vector<std::vector<const void*>>* src = nullptr;
  const std::vector<std::vector<void*>>* dst = nullptr;
  // The data-plane name of old rank r's local tensor i (on its host).
  std::function<std::string(int rank, int tensor)> region_name;
  // Reads the requests from host `peer`; called once per peer, from one thread per peer.
  std::function<Status(int peer, const std::vector<transport::ReadRequest>&)> fetch;
  ThreadPool* pool = nullptr;
  // New tensors (rank, index) that were linked to their unchanged old tensor: their
  // in-place regions need no copy (and their dst pointer is null). May be null.
  const std::set<std::pair<int, int>>* linked = nullptr;
};

// The old tensors (rank, index) of `host` that its own copies read (ExecuteHostPart's
// kept and local ops): sources of kept ops into tensors that are not in `linked` (may be
// null), and of local copies. What a prepare maps and pre-faults before executing.
std::set<std::pair<int, int>> SourcesReadHere(const plan::Plan& p,
                                              const std::vector<int>& from_hosts,
                                              const std::vector<int>& to_hosts, int host,
                                              const std::set<std::pair<int, int>>* linked);

// Executes this host's ops. Destination padding is not written (fresh store tensors
// read as zero). On error the destinations are unspecified; the caller drops them.
Result<HostExecStats> ExecuteHostPart(const HostExecInput& in);

}  // namespace tenplex::transform
