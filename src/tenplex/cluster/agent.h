// The transform agent of a store daemon: its part of a distributed state
// transformation (docs/transform.md).
//
// A store daemon (`tenplex store serve`) owns a data-plane endpoint (transport.h) that
// serves the committed tensors of its store to peer daemons by name (the store path,
// jobs/<job>/<version>/rank-NNNNN/<name>) to fetches that carry a capability for them
// (transport/capability.h, AgentOptions::capability_key), and installs these endpoints
// on its HTTP server:
//   GET  /v1/transform/address   {"address": "<transport token>", "kind": "ucx",
//                                 "local": {"host_id", "shm_dir", "store_id"}} (the
//                                 last when it offers same-host reads, local_peer.h)
//   POST /v1/transform/address   {"job": J}: the same and "incarnation", this store's
//                                incarnation of J (absent when it has none), which
//                                capabilities name (transport/capability.h)
//   POST /v1/transform/locate    {"capability": C, "tensors": [store paths]}: the
//                                shared-memory files of committed tensors that the
//                                capability covers, for a same-host peer:
//                                {"files": [{"tensor", "file", "bytes", "dev", "ino"}]}
//   POST /v1/transform/prepare   executes this host's share of a plan into a new open
//                                version (phase one of the two-phase commit)
//   POST /v1/transform/probe     {"address": A, "bytes": N}: the fetch bandwidth from
//                                the peer at A (its 64 MiB probe region, and a 512 MiB
//                                scratch region into distinct memory) and the bandwidth
//                                of writing fresh shared memory here (the limits of a
//                                benchmark)
//   POST /v1/transform/presize   the body of a prepare: makes this host's new tensors
//                                of that transform (all but the unchanged ones) ahead
//                                in the store's page pool (Store::FillPool), so that
//                                the prepare allocates warm pages; {"host", "tensors",
//                                "wanted_bytes", "poolable_bytes" (those not too small
//                                to pool), "pooled_bytes" (the job's pool now),
//                                "pool_limit", "seconds"}
//   POST /v1/transform/warm      the body of a prepare, to a host that holds old ranks
//                                but gets no new ones: maps and pre-faults the old
//                                tensors its peers will fetch ("served"), as a
//                                prepare does; writes nothing; {"host", "tensors",
//                                "seconds"}
// The replies of address, prepare, probe, presize and warm are the typed structs of
// control_replies.h (AddressReply, PrepareReply, ProbeReply, PresizeReply, WarmReply), which
// encode them here and decode them in the coordinator.
// Phase two uses the store's own endpoints: .../versions/<v>/commit or /abort, and
// .../versions/<v>/close on the hosts that did not commit v (cluster/revocation.h).
//
// Prepare request (control_protocol.h, which has every field):
//   {"host": h, "host_plan_digest": D, "served": [[old rank, tensor, reader], ...],
//    "job": J, "from_version": v0, "to_version": v1,
//    "info": {<info of v0: model, config, ...>}, "to_config": "tp=..,pp=..",
//    "new_info": {<info of v1>},
//    "addresses": ["<token of host 0>", ...]   ("" for a host that is lost)
//    "from_hosts": [host of old rank r, -1 if lost], "to_hosts": [host of new rank r], ...}
// Every host receives the same request except its first three fields. It plans its own
// part of the coordinator's plan, the ops whose destination is on it
// (plan::MakeHostPlan, deterministic; agent_plan.h), refuses it unless its digest is D,
// and executes it (host_exec.h): local copies from its old tensors, fetches of the rest
// from the peers named in the plan; "served" names its old tensors that peers will read,
// which it pre-faults ahead (agent_maps.h). The new version is left open, fully
// written: a commit only renames. Any failure drops the version here and answers the error; a peer
// that fails or does not answer is UNAVAILABLE with "host <i>" in the message. A peer on the same
// machine whose directory this daemon sees is read through its files instead of the data plane
// (local_peer.h), with the same capability and failure semantics. Tensors that stay exactly where
// they are (same device, same slice) are linked, not copied (Store::Link, local.h LinkUnchanged).
// The reply: {"version", "host", "incarnation" (this store's, of the job), "bytes_kept",
// "bytes_linked", "bytes_local", "bytes_fetched", "bytes_fetched_shm" (the part of bytes_fetched
// read from same-host peers' files), "peers", "peers_shm", "plan_seconds", "warm_seconds",
// "alloc_seconds", "local_seconds", "fetch_seconds", "landed_seconds", "seal_seconds", "seconds"}.
#pragma once

#include <memory>
#include <string>

#include "tenplex/store/server.h"
#include "tenplex/store/store.h"
#include "tenplex/transport/transport.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

struct AgentOptions {
  std::string transport = "ucx";  // "ucx" or "inproc" (tests within one process)
  transport::TransportOptions transport_options;
  // Fault injection for failure tests: "exit-in-prepare[:N]" makes the process exit
  // (as if killed) in its N-th prepare (default 1st), after allocating its new tensors
  // and before copying; "exit-in-locate[:N]" in its N-th answer to a same-host peer's
  // locate (the peer is about to read its files).
  // `tenplex store serve` takes it from the environment variable TENPLEX_FAULT.
  std::string fault;
  // The key of data-plane capabilities (transport/capability.h): the daemon token,
  // which every daemon of a cluster shares; "" without one. A peer reads this
  // daemon's tensors only with a capability minted under the same key, for the old
  // version of a transform, before it expires: `capability_lifetime` after the
  // prepare that minted it, or as soon as this daemon committed the new version.
  // Refusals are counted in tenplex_fetch_refused_total{reason=...} (GET /metrics).
  std::string capability_key;
  int64_t capability_lifetime_seconds = 900;  // <= transport::kMaxCapabilityLifetimeSeconds
  // Same-host reads (local_peer.h): offered to peers (the address reply's "local") and
  // used for peers that offer them. false: the data plane only
  // (`store serve --no-local-peer-reads`).
  bool local_peer_reads = true;
  // The bearer token of the peers' HTTP APIs (the daemon token); "" for none.
  std::string peer_token;
  // Control calls to a same-host peer (locate, health) that take longer fail.
  int peer_timeout_s = 10;
};

class Agent {
 public:
  static Result<std::unique_ptr<Agent>> Create(store::Store& store,
                                               const AgentOptions& options = {});
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  std::string address() const;
  // The agent's Prometheus metrics text (also part of the server's GET /metrics).
  std::string metrics() const;
  // Adds the /v1/transform/ endpoints to the server.
  void Install(store::Server& server);
  // The endpoints' handler (method, path, body) -> reply JSON. `coordinator` names the
  // request's coordinator (store/lease.h): a prepare begins and seals its version under
  // the job's lease.
  Result<std::string> Handle(const std::string& method, const std::string& path,
                             const std::string& body, const std::string& coordinator = "");

 private:
  struct Impl;
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tenplex::cluster
