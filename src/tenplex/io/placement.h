// Where a job's ranks live: the hosts (store daemons, one per host, by URL and stable
// host id) and how many ranks each holds. A version's info records it ("cluster",
// state_info.h) and a cluster file holds it: {"hosts": ["http://127.0.0.1:P0", ...],
// "gpus_per_host": K, "host_ids": [...]}, rank r on hosts[r / K]. Pure data and its
// JSON; connecting to the hosts and matching recorded hosts to live ones is the cluster
// module's (cluster/cluster.h).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tenplex/util/status.h"

namespace tenplex::io {

struct Cluster {
  std::vector<std::string> hosts;  // store URLs
  int gpus_per_host = 1;
  // The hosts' stable ids, parallel to hosts ("" where unknown); empty when none is
  // known (a cluster file, an info of an older build).
  std::vector<std::string> host_ids = {};

  int HostOfRank(int rank) const { return rank / gpus_per_host; }
  int Capacity() const { return static_cast<int>(hosts.size()) * gpus_per_host; }
  // rank -> host index for a world of `world_size` ranks (planner input).
  std::vector<int> RankHosts(int world_size) const;
  // hosts[i]'s id, "" when unknown.
  std::string HostId(std::size_t i) const { return i < host_ids.size() ? host_ids[i] : ""; }
};

// {"hosts", "gpus_per_host"} and "host_ids" when any is known (ParseCluster reads it).
nlohmann::json ClusterJson(const Cluster& cluster);
Result<Cluster> ParseCluster(const std::string& json_text);
Result<Cluster> ReadClusterFile(const std::string& path);

}  // namespace tenplex::io

// The names the cluster code uses unqualified (it lives in tenplex::cluster).
namespace tenplex::cluster {
using io::Cluster;
using io::ClusterJson;
using io::ParseCluster;
using io::ReadClusterFile;
}  // namespace tenplex::cluster
