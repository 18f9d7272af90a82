// The data plane: reading byte ranges of named regions exposed by other processes.
//
// Every process that holds state (a store daemon) runs a Transport. It *serves* the
// regions a RegionLookup finds (the store plugs in its shared-memory tensor files) and
// *fetches* from peers: Fetch(peer, requests) reads many runs (offset, length) of remote
// regions straight into local destination buffers. A strided box of a remote tensor
// becomes runs with AppendBoxReads (box_reads.h).
//
// Peers find each other through whatever control channel the caller has (the store's
// HTTP API): LocalAddress() is a printable token (ASCII, no spaces; it fits in JSON as
// is) and Connect(token) on another process opens a connection to it.
//
// Two implementations behind one interface (docs/transport.md):
//  - in-process: peers are Transports of the same process, reads are memcpy. For tests
//    and the single-machine default.
//  - UCX: one UCX worker per Transport driven by one progress thread; TCP between hosts
//    (RDMA where the cluster has it), active messages with rendezvous so that large
//    messages are written by UCX straight into the destination buffers.
//
// Failure semantics: Fetch never hangs. A peer that does not answer within
// `TransportOptions::timeout` (no byte of any pending request arrived for that long),
// or whose connection breaks, fails the pending requests with UNAVAILABLE; the peer
// stays failed (later Fetches fail at once) until Connect is called again with its
// address. Fetch returns only when no transfer into its destination buffers is in flight
// any more, so the caller may free them as soon as it returns, whatever it returned.
//
// Thread-safety: all methods may be called from many threads at once; each Fetch blocks
// its caller only. The RegionLookup is called on a transport thread (the UCX progress
// thread, or the fetching thread in-process) and must be thread-safe and quick.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/transport/capability.h"
#include "tenplex/util/status.h"

namespace tenplex::transport {

// A byte region this process lets peers read.
struct Region {
  const void* data = nullptr;
  uint64_t size = 0;
  // Keeps `data` valid while the transport reads it (held until the last byte of a
  // request was sent). May be null when the region outlives the transport.
  std::shared_ptr<const void> hold;
};

// Finds a region by name for a reader that presents `capability` (its request's
// ReadRequest::capability, "" when it has none): the server decides what a capability
// lets a reader see (the store's agent: transform/capability.h). NotFound for unknown
// names, PermissionDenied for a missing, wrong or expired capability; any error is
// passed to the reader as it is.
using RegionLookup =
    std::function<Result<Region>(std::string_view name, std::string_view capability)>;

// Every transport also serves this built-in region (kProbeRegionBytes of a fixed
// pattern, ProbeByte(i) at offset i) for bandwidth measurements and health checks.
// With TransportOptions::probe_key set, a read of it needs a probe capability
// (MintProbeCapability, capability.h) minted under that key.
inline constexpr std::string_view kProbeRegion = "tenplex.probe";
inline constexpr uint64_t kProbeRegionBytes = 64ull << 20;
inline uint8_t ProbeByte(uint64_t i) { return static_cast<uint8_t>((i * 131 + (i >> 12)) ^ 0x5a); }

// One contiguous read: `length` bytes at byte `offset` of the remote region go to `dest`.
struct ReadRun {
  uint64_t offset = 0;
  uint64_t length = 0;
  void* dest = nullptr;
};

// Runs of one remote region, read with a capability (sent along, at most
// 1024 bytes; "" for none) that the serving side checks.
struct ReadRequest {
  std::string region;
  std::vector<ReadRun> runs;
  std::string capability = {};
};

using PeerId = uint64_t;

struct TransportOptions {
  // A peer with pending requests that sends nothing for this long is UNAVAILABLE.
  std::chrono::milliseconds timeout{10000};
  // UCX only. UCX transports to use ("tcp", "sm", "rc,sm", ...); empty: UCX_TLS from the
  // environment, or UCX's default.
  std::string ucx_tls;
  // UCX only. Network devices UCX may use (UCX_NET_DEVICES syntax: "lo", "eth0",
  // "mlx5_0:1,eth0"); empty: UCX_NET_DEVICES from the environment, or all. A store
  // daemon restricts it to the interface of its HTTP listener (netif.h).
  std::string ucx_net_devices;
  // UCX only. Detect dead peers (UCX error handling mode PEER). UCX 1.13 cannot detect a
  // dead peer over its shared-memory transports and drops them when this is on (the
  // connection then uses TCP on the host); turning it off allows them, but a peer's
  // death may then abort this process inside UCX and a timeout may not end a Fetch
  // (UCX cannot cancel its operations). Off only for benchmarks.
  bool peer_failure_detection = true;
  // UCX only. Largest data message; bigger reads are split (progress for the timeout,
  // pipelining). Must be at least 256 KiB.
  uint64_t max_message_bytes = 4ull << 20;
  // UCX only. Client-side flow control: a Fetch is sent as requests of at most
  // max_request_bytes, and at most max_inflight_bytes of requests are outstanding per
  // peer (this also bounds the server's staging memory for packed short runs).
  uint64_t max_request_bytes = 16ull << 20;
  uint64_t max_inflight_bytes = 64ull << 20;
  // UCX only, the serving side, against peers that ignore the flow control above (issue
  // 35): a request for more than max_request_bytes is refused (INVALID_ARGUMENT); one
  // connection may have at most kServedWindowFactor x max_inflight_bytes of answers in
  // flight, a request beyond is refused (RESOURCE_EXHAUSTED); short runs are packed into
  // staging buffers only while all of those together hold at most max_staged_bytes,
  // beyond that they are sent in place (slower, no memory). So a daemon's transport
  // holds at most max_staged_bytes + its pool of free buffers (64 MiB) of staging,
  // whatever its peers ask.
  uint64_t max_staged_bytes = 256ull << 20;
  // The key of probe capabilities; unset: the probe region is open (tests, benchmarks).
  std::optional<std::string> probe_key;
};

inline constexpr uint64_t kServedWindowFactor = 4;

class Transport {
 public:
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // "inproc" or "ucx".
  virtual std::string_view kind() const = 0;

  // This transport's address token (see above).
  virtual std::string LocalAddress() const = 0;

  // Opens (or returns the open) connection to the transport with this address.
  // InvalidArgument for a token that is not an address of this kind. A failed
  // connection is replaced by a new one. Connecting does not wait for the peer to
  // answer: an unreachable peer fails Connect (when refused at once) or the first Fetch
  // with UNAVAILABLE.
  virtual Result<PeerId> Connect(std::string_view address) = 0;

  // Closes the connection. REQUIRES: no Fetch on this peer in progress.
  virtual void Disconnect(PeerId peer) = 0;

  // Reads all runs of all requests (in flight together) into their destinations.
  // OK when every run was read. Otherwise the first error in request order: NotFound
  // (unknown region), OutOfRange (a run past the region's end), UNAVAILABLE (the peer
  // failed or timed out), ...; destinations of failed requests are then unspecified,
  // those of other requests complete.
  // REQUIRES: every destination range is writable and disjoint from the others.
  virtual Status Fetch(PeerId peer, const std::vector<ReadRequest>& requests) = 0;

  // Bytes this endpoint has sent to peers, answering their fetches (metrics).
  virtual uint64_t BytesServed() const { return 0; }
  // Requests refused for their size or their connection's answers in flight, and the
  // most staging memory answers held at once (UCX; metrics and tests).
  virtual uint64_t RequestsRefused() const { return 0; }
  virtual uint64_t PeakStagedBytes() const { return 0; }
  // Reads of the probe region refused for their probe capability, by reason (with
  // TransportOptions::probe_key; metrics tenplex_fetch_refused_total).
  virtual uint64_t ProbeRefused(CapabilityRefusal /*reason*/) const { return 0; }

 protected:
  Transport() = default;
};

// `lookup` may be empty: the transport then serves only kProbeRegion.
Result<std::unique_ptr<Transport>> NewInProcessTransport(RegionLookup lookup,
                                                         const TransportOptions& options = {});
Result<std::unique_ptr<Transport>> NewUcxTransport(RegionLookup lookup,
                                                   const TransportOptions& options = {});
// kind: "inproc" or "ucx".
Result<std::unique_ptr<Transport>> NewTransport(std::string_view kind, RegionLookup lookup,
                                                const TransportOptions& options = {});

}  // namespace tenplex::transport
