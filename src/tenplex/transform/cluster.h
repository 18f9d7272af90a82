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
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tenplex/store/client.h"
#include "tenplex/util/status.h"

namespace tenplex::transform {

struct Cluster {
  std::vector<std::string> hosts;  // store URLs
  int gpus_per_host = 1;

  int HostOfRank(int rank) const { return rank / gpus_per_host; }
  int Capacity() const { return static_cast<int>(hosts.size()) * gpus_per_host; }
  // rank -> host index for a world of `world_size` ranks (planner input).
  std::vector<int> RankHosts(int world_size) const;
};

Result<Cluster> ParseCluster(const std::string& json_text);
Result<Cluster> ReadClusterFile(const std::string& path);

// One client per host, connected in host order. With allow_lost, a host that cannot
// be reached gets a null client instead of failing the whole call.
Result<std::vector<std::unique_ptr<store::Client>>> ConnectCluster(
    const Cluster& cluster, const store::ClientOptions& options, bool allow_lost = false);

// The version number one past every version the hosts report for `job` (committed,
// current or open); 1 for a new job. Null clients (lost hosts) are skipped.
Result<uint64_t> NextCommonVersion(const std::vector<store::Client*>& clients,
                                   const std::string& job);
Result<uint64_t> NextCommonVersion(const std::vector<std::unique_ptr<store::Client>>& clients,
                                   const std::string& job);

}  // namespace tenplex::transform
