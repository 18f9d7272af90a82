// Checkpoint directories (spec §7) in and out of tensor stores: one implementation for
// one store daemon and for the daemons of a cluster (a single store is a cluster of
// one host that holds every rank).
//
// Load: the directory's tenplex.json is read, the model and config give the layout,
// every rank file is opened and checked against it (with `verify`, the default, xxh64
// checksums are required for every rank file and checked: io::VerifyChecksums), and rank r's
// tensors go to its host (r / gpus_per_host). One version with the same number is begun on every
// host that gets ranks, written, and committed on all of them (or aborted on all): it is only
// current once every host committed.
//
// Save: the job's committed state is found across the hosts (cluster_state.h: the
// newest version, where its ranks live, which hosts are lost). The ranks of hosts
// that answer are read as they are; the ranks of a lost host are rebuilt from
// replicas on the others (the planner's ops into a virtual saver host, executed with
// reads from the surviving stores), so one dead host does not make a checkpoint with
// dp replicas unsaveable; a box with no surviving replica fails with DataLoss naming
// it. The output is written through io::CheckpointWriter (staging directory, rank
// files, tenplex.json with checksums last, rename into place).
//
// Round trips are exact: the version's info (state_info.h) records every tenplex.json
// field and, per rank file, its __metadata__ and its tensor order when that is not the
// default (the layout's order, then other names sorted), and save writes them back;
// every training field of a version (step, samples_consumed, ...) goes into the
// saved tenplex.json.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tenplex/cluster/cluster.h"
#include "tenplex/store/client.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

struct TransferStats {
  uint64_t version = 0;
  uint64_t bytes = 0;
  std::size_t tensors = 0;
  int ranks = 0;
  // The hosts actually used: that got ranks (load), that were read from (save).
  std::vector<std::string> hosts;
  // Save: hosts of the version that did not answer, and the ranks rebuilt from replicas.
  std::vector<std::string> lost_hosts;
  int rebuilt_ranks = 0;
  // Load --cluster: hosts whose commit reply never came (the decision is commit; their
  // prepared version is committed by the next operation on the job, two_phase.h).
  std::vector<std::string> unconfirmed_hosts;
  bool shm = false;       // every byte went through shared memory
  bool verified = false;  // load: every rank file's recorded checksum matched
  double seconds = 0;
};

// One store.
Result<TransferStats> LoadCheckpoint(store::Client& client, const std::string& job,
                                     const std::string& dir, bool verify = true);
Result<TransferStats> SaveCheckpoint(store::Client& client, const std::string& job,
                                     const std::string& out);

// The daemons of a cluster: clients[h] is the client of cluster.hosts[h] (null: lost;
// load needs every host that gets ranks). Load records the placement in the version's
// info ("cluster": the hosts that got ranks).
Result<TransferStats> LoadCheckpointToCluster(
    const Cluster& cluster, const std::vector<std::unique_ptr<store::Client>>& clients,
    const std::string& job, const std::string& dir, bool verify = true);
Result<TransferStats> SaveCheckpointFromCluster(
    const Cluster& cluster, const std::vector<std::unique_ptr<store::Client>>& clients,
    const std::string& job, const std::string& out);

}  // namespace tenplex::cluster
