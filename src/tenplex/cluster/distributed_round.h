// One round of the distributed transform's coordinator (distributed.h): the hosts as
// the coordinator sees them, the round's inputs, phase one on every participant (the
// prepare, watched for silent hosts) and the decision (commit everywhere, or abort on
// those that may hold the version), or a round that only pre-sizes. Internal to
// distributed.cc, which plans the rounds and retries them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tenplex/cluster/control_protocol.h"
#include "tenplex/cluster/distributed.h"
#include "tenplex/store/client.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster::coordinator {

struct Host {
  std::string url;
  std::unique_ptr<store::Client> client;  // null: lost
  std::string address;                    // data-plane address ("" until asked, or lost)
  LocalPeer local;                        // its same-host reads offer (empty: none)
  std::string incarnation;                // its store's incarnation of the job ("": none)
};

struct Round {
  uint64_t from_version = 0, to_version = 0;
  nlohmann::json info;  // of from_version: model, config, cluster, ...
  ParallelConfig to_config;
  nlohmann::json new_info;
  std::vector<int> from_hosts, to_hosts;
  std::vector<HostPart> parts;  // per host: its part's digest, what peers read from it
};

struct RoundResult {
  Status status;
  std::vector<HostTransformReport> hosts;
  std::vector<int> silent;               // participants that stopped answering
  std::vector<std::string> unconfirmed;  // committed by decision, reply never came
  double prepare_seconds = 0, commit_seconds = 0;
};

double Since(std::chrono::steady_clock::time_point t0);
std::vector<store::Client*> Raw(const std::vector<Host>& hosts);
// Forgets a host for the rest of the transform (its client, address, offer, incarnation).
void MarkLost(Host& h);

// ClusterTransformOptions::presize_only: every participant of r makes its new tensors
// ahead in its page pool, all at once; the first failure is returned, and each
// participant's report is added to stats.presized.
Status PresizeRound(const std::vector<Host>& hosts, const std::string& job, const Round& r,
                    const store::ClientOptions& client_options,
                    const ClusterTransformOptions& options, ClusterTransformStats& stats);

// Phase one on every host with new ranks, then phase two (commit, or abort on all).
// Silent participants are marked lost (out.silent).
RoundResult RunRound(std::vector<Host>& hosts, const std::string& job, const Round& r,
                     const store::ClientOptions& client_options,
                     const ClusterTransformOptions& options);

}  // namespace tenplex::cluster::coordinator
