// A cluster of store daemons, one per host, and how ranks map onto them.
//
// A cluster file is a JSON object {"hosts": ["http://127.0.0.1:P0", ...],
// "gpus_per_host": K}: rank r lives on hosts[r / K]. The distributed operations on a
// job's state (load, save, transform) connect to every host and keep one version
// number common to all of them, so "version v of job J" names the same state
// everywhere: a version is started on every host with the same explicit number, the
// ranks of each host are written to it, and it is committed on all hosts or aborted
// on all. Checkpoint directories in and out of a cluster: checkpoint_transfer.h; where
// a job's committed state lives: cluster_state.h.
//
// Host identity. A host is its store daemon's stable host id (Store::host_id, served by
// /v1/health, kept in <shm-dir>/HOST_ID across restarts), not the URL it is reached by:
// a version's info records "host_ids" parallel to "hosts" (ids of the clients that
// wrote it), and a recorded host is matched to a live one by id when both are known,
// by URL only when one side has no id (an info written before ids existed, a daemon of
// an older build). So a job keeps finding its state when its hosts are named by other
// URLs (another interface, a renamed host).
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tenplex/cluster/job_listing.h"
#include "tenplex/io/placement.h"
#include "tenplex/store/client.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

// One client per host, connected in host order. With allow_lost, a host that cannot
// be reached gets a null client instead of failing the whole call. Two URLs that reach
// one daemon (the same host id) are InvalidArgument.
Result<std::vector<std::unique_ptr<store::Client>>> ConnectCluster(
    const Cluster& cluster, const store::ClientOptions& options, bool allow_lost = false);

// The cluster with its hosts' ids taken from clients (parallel to cluster.hosts; a null
// client or one of a daemon without an id leaves the id unknown).
Cluster WithHostIds(Cluster cluster, const std::vector<store::Client*>& clients);
Cluster WithHostIds(Cluster cluster, const std::vector<std::unique_ptr<store::Client>>& clients);

// Which of the given hosts (urls[h], clients[h]; null: not answering) is host `slot` of
// a recorded placement: by host id when both the placement and the host's client know
// one (the URL may differ), else by URL; an id match wins; -1 when none.
int MatchHost(const Cluster& placement, std::size_t slot, const std::vector<std::string>& urls,
              const std::vector<store::Client*>& clients);

// MatchHost for many slots: indexes the hosts once (by id and by URL), so that matching
// every slot of a placement of N hosts costs O(N log N), not O(N^2). Keeps references
// to urls and clients.
class HostMatcher {
 public:
  HostMatcher(const std::vector<std::string>& urls, const std::vector<store::Client*>& clients);
  int Match(const Cluster& placement, std::size_t slot) const;

 private:
  const std::vector<store::Client*>& clients_;
  std::map<std::string, int> by_id_;                // first host with each id
  std::map<std::string, std::vector<int>> by_url_;  // hosts with each URL, in order
};

// The version number one past every version the hosts report for `job` (committed,
// current or open); 1 for a new job. Null clients (lost hosts) are skipped.
Result<uint64_t> NextCommonVersion(const std::vector<store::Client*>& clients,
                                   const std::string& job);
Result<uint64_t> NextCommonVersion(const std::vector<std::unique_ptr<store::Client>>& clients,
                                   const std::string& job);
// The same from a listing of the job read from `clients` (ReadJobListing).
Result<uint64_t> NextCommonVersion(const std::vector<store::Client*>& clients,
                                   const JobListing& listing);

}  // namespace tenplex::cluster
