// A cluster of store daemons, one per host, and how ranks map onto them.
//
// A cluster file is a JSON object {"hosts": ["http://127.0.0.1:P0", ...],
// "gpus_per_host": K}: rank r lives on hosts[r / K]. The distributed operations on a
// job's state (load, save, transform) connect to every host and keep one version
// number common to all of them, so "version v of job J" names the same state
// everywhere: a version is started on every host with the same explicit number, the
// ranks of each host are written to it, and it is committed on all hosts or aborted
// on all.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tenplex/store/checkpoint_transfer.h"
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
Result<std::vector<std::unique_ptr<store::Client>>> ConnectCluster(const Cluster& cluster,
                                                                   const store::ClientOptions& options,
                                                                   bool allow_lost = false);

// The version number one past every version the hosts report for `job` (committed,
// current or open); 1 for a new job. Null clients (lost hosts) are skipped.
Result<uint64_t> NextCommonVersion(const std::vector<store::Client*>& clients, const std::string& job);
Result<uint64_t> NextCommonVersion(const std::vector<std::unique_ptr<store::Client>>& clients,
                                   const std::string& job);

// Loads a checkpoint directory: each rank's tensors go to its host; one version with
// the same number is committed on all hosts (or none).
Result<store::TransferStats> LoadCheckpointToCluster(const Cluster& cluster,
                                                     const std::vector<std::unique_ptr<store::Client>>& clients,
                                                     const std::string& job, const std::string& dir);

// Where a version's ranks live: the "cluster" of its info (written by load and
// transform), or `fallback` when it has none.
Cluster VersionPlacement(const std::string& info_json, const Cluster& fallback);

// Writes the newest current version of `job` as one checkpoint directory, atomically.
// The hosts the version lives on (VersionPlacement) must all be in `cluster`, answer
// and report the same version and info; other hosts (null clients: lost) are ignored.
Result<store::TransferStats> SaveCheckpointFromCluster(const Cluster& cluster,
                                                       const std::vector<std::unique_ptr<store::Client>>& clients,
                                                       const std::string& job, const std::string& out);

}  // namespace tenplex::transform
