// Finding a job's committed state across the store daemons of a cluster: the one rule
// that the distributed transform, `store save --cluster` and everything else that
// reads state spread over hosts use.
//
// Rule. Every host that answers is asked for the job's current version. The newest
// version any host reports is the state (a host that reports an older one missed a
// commit: stale). Its ranks live where its info's "cluster" says (or, when it has
// none, on `fallback`). Old rank r is available on the host of its slot when that
// host is one of the given hosts (matched by host id, by URL where an id is unknown:
// MatchHost in cluster.h), answered, and reports the same version with the
// same info; otherwise the rank is lost (plan::kLostHost): its host is dead
// (Unavailable), gone from the cluster, restarted empty (NotFound) or stale. Lost
// ranks are not an error here: whether their state survives in replicas is the
// planner's question (plan::MakePlan fails with DataLoss when it does not). Any other
// error (a wrong token, a malformed reply) is returned, naming the host; no live host
// with a version of the job is NotFound (Unavailable when no host answers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tenplex/cluster/cluster.h"
#include "tenplex/cluster/job_listing.h"
#include "tenplex/io/state_info.h"
#include "tenplex/store/client.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

struct CommittedState {
  uint64_t version = 0;
  std::string info_text;  // verbatim, as the hosts report it
  StateInfo info;
  Cluster placement;             // where its ranks live
  std::vector<int> rank_hosts;   // old rank -> index into the hosts, or plan::kLostHost
  std::vector<int> holders;      // hosts that hold ranks of it, ascending
  std::vector<int> unavailable;  // hosts that did not answer (null clients included)

  int lost_ranks() const;
};

// urls[h] is host h's URL, clients[h] its client (null: known lost).
Result<CommittedState> FindCommittedState(const std::vector<std::string>& urls,
                                          const std::vector<store::Client*>& clients,
                                          const std::string& job, const Cluster& fallback);
// The same from a listing of the job read from these clients (job_listing.h): no request.
Result<CommittedState> FindCommittedState(const std::vector<std::string>& urls,
                                          const std::vector<store::Client*>& clients,
                                          const std::string& job, const Cluster& fallback,
                                          const JobListing& listing);

}  // namespace tenplex::cluster
