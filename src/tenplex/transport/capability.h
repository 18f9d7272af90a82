// Data-plane capabilities: what lets a peer read a daemon's tensors over the data plane.
//
// A store daemon's data-plane endpoint (cluster/agent.h) serves committed tensors by
// store path. Without a check, any process that reaches the endpoint could read any
// job's state; so every fetch carries a capability, and the server answers only a
// request whose capability is valid *now* and covers the region it reads.
//
// A capability is minted by the participant of a transform that fetches (in its
// prepare), one per serving peer, and checked by the daemon that serves, statelessly:
// it is a statement
//   "the holder may read version V of incarnation I of job J, for the transform V -> W,
//    until time T"
// signed with HMAC-SHA256 under a key every daemon of the cluster shares (the daemon
// token, `--token-file` / TENPLEX_TOKEN). Its text, ASCII without spaces:
//   tpc2:<V>:<W>:<T, unix seconds>:<I, 16 hex digits>:<64 hex digits of the MAC>:<J>
// and the MAC covers "tenplex-fetch-v2\n" J "\n" I "\n" V "\n" W "\n" T. Nobody without
// the key can mint one. A minted one reads only the old version of its job (the only
// tensors a transform reads from peers) on the one store whose copy of the job has
// incarnation I, and dies at T (at most kMaxCapabilityLifetimeSeconds ahead), or earlier
// once the transform is over there:
//  - Incarnation (store::JobInfo::incarnation): every store gives its copy of a job a
//    random 64-bit id when it creates the job directory, kept in the directory across
//    restarts. Stores create their copies independently, so the ids differ per host and
//    the coordinator learns each host's (its POST /v1/transform/address names the job;
//    a prepare's reply names the participant's, for the rounds that follow) and sends
//    them in the prepare (control_protocol.h "incarnations"). A job deleted and created
//    again, or the same job on another host, has another id: the capability is refused
//    there (issue 35: an old capability read a re-created job of the same name).
//  - End of the transform: the serving store refuses once its current version is W or
//    newer (it committed the transform), or once its closed mark (JobInfo::closed) is W
//    or newer. The coordinator raises the mark on every host of the transform that did
//    not commit W, after its commit or abort (cluster/revocation.h: one small request
//    per such host), and a store raises it itself when it drops an uncommitted W (an
//    abort). So a host that got no ranks of W and only gave its tensors away, which
//    never commits W, refuses the transform's capabilities once it is over (issue 35).
//    A host the coordinator cannot reach then refuses at T.
// The statelessness matters: a daemon that only gives its tensors away (it holds no
// rank of the new version) never sees the transform's prepare.
// Format versions: tpc1 (no incarnation) is refused as wrong since tpc2: a tpc1
// capability can never name an incarnation, and daemons of one cluster run one build
// (the prepare's plan digest and protocol version already require it).
//
// Without a token (allowed only on loopback) the key is empty: capabilities are then
// as forgeable as the HTTP API is open, and a fetch without one is still refused.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "tenplex/util/status.h"

namespace tenplex::transport {

inline constexpr std::string_view kNoIncarnation = "0000000000000000";

struct CapabilityGrant {
  std::string job;
  uint64_t from_version = 0;  // the version it reads
  uint64_t to_version = 0;    // the version the transform writes
  int64_t expires = 0;        // unix seconds
  // The serving store's incarnation of the job (16 lower-case hex digits); probe
  // capabilities have kNoIncarnation.
  std::string incarnation = std::string(kNoIncarnation);
};

// The longest a capability may live: a daemon mints them for 15 minutes
// (cluster/agent.h); one whose expiry lies further ahead than this was not minted by
// a daemon (a key holder forging a capability that outlives every transform) and is
// refused as wrong (issue 35: an expiry in the year 2^40 was accepted).
inline constexpr int64_t kMaxCapabilityLifetimeSeconds = 3600;

// Why a capability was refused (the server's metrics count each).
enum class CapabilityRefusal { kNone, kMissing, kWrong, kExpired, kScope };
std::string_view CapabilityRefusalName(CapabilityRefusal r);

// Refusals counted by reason, thread-safe: a server's metrics
// (tenplex_fetch_refused_total{reason=...}).
class RefusalCounter {
 public:
  void Add(CapabilityRefusal r) { n_[static_cast<int>(r)].fetch_add(1, std::memory_order_relaxed); }
  uint64_t Get(CapabilityRefusal r) const { return n_[static_cast<int>(r)].load(); }

 private:
  std::array<std::atomic<uint64_t>, 5> n_{};
};

std::string MintCapability(std::string_view key, const CapabilityGrant& grant);

// Probe capabilities: a grant for the pseudo-job kProbeRegion at version 0 (store
// versions start at 1, so it covers no tensor), which lets the holder read the probe
// regions (the built-in one and an agent's scratch region) only.
std::string MintProbeCapability(std::string_view key, int64_t lifetime_seconds = 900);
// Ok, or PermissionDenied saying why `capability` is not a valid probe capability now
// (counted in `refused` by reason when given; another job's capability: kScope).
Status CheckProbeCapability(std::string_view key, std::string_view capability,
                            RefusalCounter* refused = nullptr);
// The system clock in unix seconds (capabilities' time).
int64_t UnixSeconds();
// HMAC-SHA256(key, message) as 64 lowercase hex digits (OpenSSL's).
std::string HmacSha256Hex(std::string_view key, std::string_view message);

struct CapabilityCheck {
  CapabilityRefusal refusal = CapabilityRefusal::kNone;
  CapabilityGrant grant;  // valid when refusal is kNone or kExpired
  std::string why;        // for the refused reader
};
// Checks the signature, the expiry against `now` (unix seconds) and the lifetime
// (kMaxCapabilityLifetimeSeconds); the caller checks
// the scope (region inside grant.job / grant.from_version) and the transform's end.
CapabilityCheck CheckCapability(std::string_view key, std::string_view capability, int64_t now);

}  // namespace tenplex::transport
