// The distributed state transformation (`tenplex transform --cluster`): the committed
// version of a job, spread over the store daemons of a cluster, becomes a new version
// laid out for another parallel config, on the same hosts or on others.
//
// Coordinator (this code, in the CLI process) and agents (agent.h, one per daemon):
//  1. Ask every host for the job's current version. The newest version that a host
//     reports is the state; hosts that report it with the same info hold their ranks
//     of it (the info's "cluster" says which ranks live where); the ranks of every
//     other host (dead, restarted empty, stale) are plan::kLostHost.
//  2. Place the new layout: new rank r on the r / K-th live host of the target cluster
//     (`to`, default the old cluster), K = its gpus_per_host.
//  3. Plan here (plan::MakePlan; each agent computes its own part of the same
//     deterministic plan, plan::MakeHostPlan, and checks it against the digest of that
//     part, control_protocol.h): a state with no surviving replica fails now with
//     DataLoss naming the tensor and box, before any host changed anything.
//  4. Phase one: every host with new ranks is sent the same prepare request (with its
//     host index and its part's digest), all at once; each writes its ranks into an open version
//     v+1 from its own tensors and, over the data plane, from its peers (host_exec.h).
//  5. Phase two (two_phase.h): when every prepare succeeded (each participant made v+1
//     prepared: durable across its restart), v+1 is committed on each of them with the
//     old version kept, and released in a second round once every participant
//     confirmed. If any prepare failed or a participant went silent (bounded per-phase
//     deadlines, ClusterTransformOptions), v+1 is aborted everywhere; hosts that no
//     longer answer are marked lost and the transform starts again from 1 (at most
//     max_attempts times). If no host was lost, the error is returned. Either way every
//     surviving host still serves the old version, unchanged.
// Each attempt starts by finishing or rolling back what an earlier transform left half
// done (ResolvePending): a host that died between the last prepare and its commit keeps
// its prepared version across a restart, and it is committed there, so every host
// converges to one version.
//
// The central baseline (`--central`, for benchmarks) moves the same state the way a
// single-process converter would, using the same agents: gather every old rank on one
// host, re-slice there, scatter the new ranks (three rounds of the above, the first
// and last cross-host, the middle one local).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tenplex/cluster/cluster.h"
#include "tenplex/cluster/control_replies.h"
#include "tenplex/plan/planner.h"
#include "tenplex/ptc/config.h"
#include "tenplex/store/client.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

struct ClusterTransformOptions {
  std::optional<Cluster> to;  // the target hosts; default: the old cluster
  int max_attempts = 3;
  // Per-phase deadlines (docs/reliability.md). Every control request (state, address,
  // commit, abort, health) times out after control_timeout_s. During the prepare every
  // participant still working is asked GET /v1/health every 0.5 s; one that has not
  // answered for silent_s is silent (stopped, hung): the round is aborted and re-planned
  // without it. A prepare that takes longer than prepare_timeout_s in all fails.
  int control_timeout_s = 10;
  int silent_s = 10;
  int prepare_timeout_s = 3600;
  bool central = false;
  // Same-host reads (local_peer.h): hosts that offer them are announced to the agents,
  // which read same-host peers through their files. false: the data plane only
  // (`tenplex transform --no-local-peer-reads`).
  bool local_peer_reads = true;
  // Only pre-size: plan the transform as usual (recovery, placement, plan), then ask
  // every host with new ranks to make its new tensors ahead in its page pool
  // (POST /v1/transform/presize, Store::FillPool) and return; nothing is written or
  // committed. The transform that follows (same state, same target) allocates from the
  // pools: run it while the old config still trains (a joining host holds nothing of
  // the job, so its pool is otherwise empty).
  bool presize_only = false;
  // The job's coordinator lease (job_lease.h) is taken on every host before the
  // recovery: while another coordinator holds it, wait up to this long, then fail
  // naming it. The coordinator's name is client_options.coordinator (a fresh one when
  // empty). A pre-size takes no lease (it changes no version), nor does a caller that
  // holds the lease itself under that name (lease_held: `tenplex run --cluster`).
  double lease_wait_s = 60;
  bool lease_held = false;
  std::function<void(const std::string&)> log;  // progress lines (may be empty)
};

struct HostPresizeReport {
  std::string url;
  int64_t wanted_bytes = 0;    // its new tensors' bytes
  int64_t poolable_bytes = 0;  // of those, the tensors large enough to pool
  int64_t pooled_bytes = 0;    // the job's pool on it afterwards
  double seconds = 0;
};

// A participant of the last round: its prepare's reply (bytes by how they came, the
// phases' seconds: control_replies.h) and where it is.
struct HostTransformReport {
  std::string url;
  int ranks = 0;  // new ranks placed on it
  PrepareReply prepare;
};

struct ClusterTransformStats {
  uint64_t from_version = 0, to_version = 0;
  std::string from_config, to_config;
  int attempts = 0;
  std::vector<std::string> lost_hosts;     // URLs treated as lost
  std::vector<std::string> new_hosts;      // where the new version lives (its "cluster")
  plan::PlanStats plan;                    // host indexes: into all_hosts
  std::vector<std::string> all_hosts;      // every host of both clusters, old ones first
  std::vector<HostTransformReport> hosts;  // the last round's participants
  double plan_seconds = 0, prepare_seconds = 0, commit_seconds = 0, seconds = 0;
  std::vector<double> round_seconds;  // central: gather, re-slice, scatter
  // Participants whose commit reply never came: the decision is commit and stands (their
  // prepared version is durable and committed by the next operation on the job).
  std::vector<std::string> unconfirmed_hosts;
  std::vector<std::string> recovered;       // what the recovery at the start did (two_phase.h)
  std::vector<HostPresizeReport> presized;  // presize_only: every participant
};

Result<ClusterTransformStats> TransformCluster(const Cluster& from, const std::string& job,
                                               const ParallelConfig& to,
                                               const store::ClientOptions& client_options,
                                               const ClusterTransformOptions& options = {});

// "kept 1.2 GiB, local 300 MiB, cross-host 2.1 GiB (busiest host 600 MiB) in 3.4 s ..."
std::string ClusterTransformSummary(const ClusterTransformStats& s);

}  // namespace tenplex::cluster
