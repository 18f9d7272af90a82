// The replies of the control-plane protocol (control_protocol.h, version 3): what a
// daemon's transform agent (agent.h) answers a coordinator (distributed.h) or an
// operator, one typed struct each, encoded by the agent and decoded by the reader from
// the same definition here.
//
//   POST /v1/transform/prepare   PrepareReply
//   POST /v1/transform/presize   PresizeReply
//   POST /v1/transform/warm      WarmReply
//   POST /v1/transform/probe     ProbeReply
//   GET|POST /v1/transform/address  AddressReply
//   POST /v1/transform/locate    LocateReply (to a same-host peer, local_peer.h)
//
// Decoding. A reply is one JSON object (of bounded depth). A field that is absent keeps
// its default (an agent of this protocol version sends every field; the version itself
// is checked on the request, which names both versions when they differ); unknown
// fields are ignored. A field of the wrong type or out of its range (a negative or
// non-integral count, seconds or a rate that is negative, not finite or past any real
// value, an index past 2^30, a string past its bound) is InvalidArgument naming the
// reply and the field: a hostile or broken daemon is refused, never trusted with a
// nonsense figure. Every decoded reply encodes to one that decodes to equal fields.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/util/status.h"

namespace tenplex::cluster {

// The reply to a prepare that wrote version `version` on host `host` (agent.h).
struct PrepareReply {
  uint64_t version = 0;
  int host = 0;
  std::string incarnation;  // this store's incarnation of the job ("": none)
  int64_t bytes_kept = 0, bytes_linked = 0, bytes_local = 0, bytes_fetched = 0;
  int64_t bytes_fetched_shm = 0;  // the part of bytes_fetched read from same-host peers' files
  int64_t remote_ops = 0;
  int peers = 0, peers_shm = 0;
  double plan_seconds = 0, warm_seconds = 0, alloc_seconds = 0, local_seconds = 0;
  double fetch_seconds = 0, landed_seconds = 0, seal_seconds = 0, seconds = 0;
  bool operator==(const PrepareReply&) const = default;
};

// The reply to a pre-size: the host's new tensors (count and bytes), those large enough
// to pool, the job's pool on it afterwards, the store's pool limit.
struct PresizeReply {
  int host = 0;
  int64_t tensors = 0, wanted_bytes = 0, poolable_bytes = 0, pooled_bytes = 0;
  uint64_t pool_limit = 0;
  double seconds = 0;
  bool operator==(const PresizeReply&) const = default;
};

// The reply to a warm: the old tensors this host mapped and pre-faulted for its peers'
// fetches, and the seconds it took.
struct WarmReply {
  int host = 0;
  int64_t tensors = 0;
  double seconds = 0;
  bool operator==(const WarmReply&) const = default;
};

// The reply to a bandwidth probe (GB/s of each measurement, agent_probe.h).
struct ProbeReply {
  uint64_t bytes = 0;
  double fetch_gbps = 0, fetch_large_gbps = 0, fetch_into_shm_gbps = 0;
  double fetch_into_shm_first_gbps = 0, fresh_write_gbps = 0, memcpy_gbps = 0;
  bool operator==(const ProbeReply&) const = default;
};

// The agent's data-plane endpoint: its address ("address", required), the transport's
// kind, the store's incarnation of the job asked about ("": none), and its offer of
// same-host reads ("local": host_id, shm_dir, store_id; nullopt when not offered; a
// LocalPeer (control_protocol.h) once the host's URL is added).
struct AddressReply {
  struct Local {
    std::string host_id, shm_dir, store_id;
    bool operator==(const Local&) const = default;
  };
  std::string address, kind, incarnation;
  std::optional<Local> local;
  bool operator==(const AddressReply&) const = default;
};

// The shared-memory files of the committed tensors a same-host peer asked for, in the
// order asked: the store path, its file (under the daemon's shm_dir), size and identity
// (device and inode, transport/peer_files.h). At most kMaxLocated.
struct LocateReply {
  struct File {
    std::string tensor, file;
    uint64_t bytes = 0, dev = 0, ino = 0;
    bool operator==(const File&) const = default;
  };
  static constexpr std::size_t kMaxLocated = 100000;
  std::vector<File> files;
  bool operator==(const LocateReply&) const = default;
};

std::string EncodePrepareReply(const PrepareReply& reply);
std::string EncodePresizeReply(const PresizeReply& reply);
std::string EncodeWarmReply(const WarmReply& reply);
std::string EncodeProbeReply(const ProbeReply& reply);
std::string EncodeAddressReply(const AddressReply& reply);
std::string EncodeLocateReply(const LocateReply& reply);

Result<PrepareReply> DecodePrepareReply(std::string_view body);
Result<PresizeReply> DecodePresizeReply(std::string_view body);
Result<WarmReply> DecodeWarmReply(std::string_view body);
Result<ProbeReply> DecodeProbeReply(std::string_view body);
Result<AddressReply> DecodeAddressReply(std::string_view body);
Result<LocateReply> DecodeLocateReply(std::string_view body);

}  // namespace tenplex::cluster
