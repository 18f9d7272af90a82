// `tenplex store load|save --cluster`: a checkpoint across the store daemons of a
// cluster file (src/tenplex/transform/cluster.h, docs/transform.md).
#include <cstdio>
#include <cstdlib>

#include "tenplex/cli/command.h"
#include "tenplex/transform/cluster.h"
#include "tenplex/util/format.h"

namespace tenplex::cli {

Status StoreClusterTransfer(bool load, const std::string& cluster_path, const std::string& url,
                            const std::string& token, const std::string& job, const std::string& dir) {
  if (cluster_path.empty() == url.empty()) return InvalidArgument("give exactly one of --url and --cluster");
  TP_ASSIGN_OR_RETURN(transform::Cluster cluster, transform::ReadClusterFile(cluster_path));
  store::ClientOptions co;
  co.token = token;
  if (co.token.empty() && std::getenv("TENPLEX_TOKEN") != nullptr) co.token = std::getenv("TENPLEX_TOKEN");
  TP_ASSIGN_OR_RETURN(auto clients, transform::ConnectCluster(cluster, co));
  if (load) {
    TP_ASSIGN_OR_RETURN(store::TransferStats s, transform::LoadCheckpointToCluster(cluster, clients, job, dir));
    std::printf("loaded %zu tensors (%s) of %d ranks onto %zu hosts as jobs/%s/%llu (committed on all) in %.2f s\n",
                s.tensors, HumanBytes(static_cast<int64_t>(s.bytes)).c_str(), s.ranks, cluster.hosts.size(),
                job.c_str(), static_cast<unsigned long long>(s.version), s.seconds);
  } else {
    TP_ASSIGN_OR_RETURN(store::TransferStats s, transform::SaveCheckpointFromCluster(cluster, clients, job, dir));
    std::printf("saved jobs/%s/%llu from %zu hosts to %s: %zu tensors (%s) of %d ranks in %.2f s\n", job.c_str(),
                static_cast<unsigned long long>(s.version), cluster.hosts.size(), dir.c_str(), s.tensors,
                HumanBytes(static_cast<int64_t>(s.bytes)).c_str(), s.ranks, s.seconds);
  }
  return Status::Ok();
}

}  // namespace tenplex::cli
