// Data-plane capabilities: what lets a peer read a daemon's tensors over the data plane.
//
// A store daemon's data-plane endpoint (transform/agent.h) serves committed tensors by
// store path. Without a check, any process that reaches the endpoint could read any
// job's state; so every fetch carries a capability, and the server answers only a
// request whose capability is valid *now* and covers the region it reads.
//
// A capability is minted by the participant of a transform that fetches (in its
// prepare) and checked by the daemon that serves, statelessly: it is a statement
//   "the holder may read version V of job J, for the transform V -> W, until time T"
// signed with HMAC-SHA256 under a key every daemon of the cluster shares (the daemon
// token, `--token-file` / TENPLEX_TOKEN). Its text, ASCII without spaces:
//   tpc1:<V>:<W>:<T, unix seconds>:<64 hex digits of the MAC>:<J>
// and the MAC covers "tenplex-fetch-v1\n" J "\n" V "\n" W "\n" T. Nobody without the key
// can mint one; a minted one reads only the old version of its job (the only tensors
// a transform reads from peers) and dies at T, or earlier once the transform is over
// (the serving daemon has committed version W or a later one: CapabilityGrant::to_version
// lets the server check). The statelessness matters: a daemon that only gives its
// tensors away (it holds no rank of the new version) never sees the transform's prepare.
//
// Without a token (allowed only on loopback) the key is empty: capabilities are then
// as forgeable as the HTTP API is open, and a fetch without one is still refused.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tenplex/util/status.h"

namespace tenplex::transport {

struct CapabilityGrant {
  std::string job;
  uint64_t from_version = 0;  // the version it reads
  uint64_t to_version = 0;    // the version the transform writes
  int64_t expires = 0;        // unix seconds
};

// The longest a capability may live: a daemon mints them for 15 minutes
// (transform/agent.h); one whose expiry lies further ahead than this was not minted by
// a daemon (a key holder forging a capability that outlives every transform) and is
// refused as wrong (issue 35: an expiry in the year 2^40 was accepted).
inline constexpr int64_t kMaxCapabilityLifetimeSeconds = 3600;

// Why a capability was refused (the server's metrics count each).
enum class CapabilityRefusal { kNone, kMissing, kWrong, kExpired, kScope };
std::string_view CapabilityRefusalName(CapabilityRefusal r);

std::string MintCapability(std::string_view key, const CapabilityGrant& grant);

// Probe capabilities: a grant for the pseudo-job kProbeRegion at version 0 (store
// versions start at 1, so it covers no tensor), which lets the holder read the probe
// regions (the built-in one and an agent's scratch region) only.
std::string MintProbeCapability(std::string_view key, int64_t lifetime_seconds = 900);
// Ok, or PermissionDenied saying why `capability` is not a valid probe capability now.
Status CheckProbeCapability(std::string_view key, std::string_view capability);
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
