// The control-plane protocol between a transform's coordinator (distributed.h) and
// the transform agent of every daemon (agent.h): the prepare request of phase one.
//
// Protocol version 2. `POST /v1/transform/prepare` carries one JSON object:
//   {"protocol": 2,                      this header's kControlProtocolVersion
//    "job": "j", "from_version": 3, "to_version": 4,
//    "host": 2,                          the receiver's index into addresses
//    "info": {...},                      the old version's info (state_info.h)
//    "to_config": "tp=2,pp=2,dp=1",
//    "new_info": {...},                  the info the new version is begun with
//    "addresses": ["...", "", ...],      data-plane address per host ("": lost)
//    "from_hosts": [0, -1, ...],         old rank -> host (-1: lost)
//    "to_hosts": [0, 0, 1, ...],         new rank -> host
//    "plan_digest": "0123456789abcdef",  PlanDigest of the coordinator's plan
//    "incarnations": ["<16 hex>", "", ...] per host: its store's incarnation of the
//                                        job ("": none known), which the capabilities
//                                        of fetches from it name (transport/
//                                        capability.h); new in version 2
//    "local_peers": [{"url", "host_id", "shm_dir", "store_id"} | null, ...]}
//                                        optional, one per host: where a host on the
//                                        same machine keeps its shared memory (its
//                                        GET /v1/transform/address "local"), for
//                                        same-host reads (agent.h); absent or null:
//                                        the data plane only
// Unknown fields are refused. Correctness rests on every host computing the same plan
// from these inputs (no plan is shipped), so the coordinator sends the digest of its
// own plan and an agent refuses (FailedPrecondition) to run a plan whose digest
// differs: a daemon of another build must not silently execute a different plan. A
// request of another protocol version is refused the same way, naming both versions.
// Changing any of this means a new kControlProtocolVersion.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/plan/planner.h"
#include "tenplex/ptc/config.h"
#include "tenplex/transform/state_info.h"
#include "tenplex/util/status.h"

namespace tenplex::transform {

inline constexpr uint32_t kControlProtocolVersion = 2;

// A host that offers same-host reads of its committed tensors (agent.h): its store
// URL (for the control calls and its health), the boot id of its machine, its
// shared-memory directory and the id in that directory's STORE_ID file.
struct LocalPeer {
  std::string url, host_id, shm_dir, store_id;
  bool empty() const { return url.empty(); }
};

struct PrepareRequest {
  std::string job;
  uint64_t from_version = 0, to_version = 0;
  int host = 0;
  std::string info;  // JSON object text: the old version's info
  ParallelConfig to_config;
  std::string new_info;  // JSON object text
  std::vector<std::string> addresses;
  std::vector<int> from_hosts, to_hosts;
  std::string plan_digest;
  std::vector<LocalPeer> local_peers;     // empty, or one per address (empty() for none)
  std::vector<std::string> incarnations;  // one per address ("": none known)
};

std::string EncodePrepare(const PrepareRequest& request);

// The same in two steps, for a round with thousands of participants whose requests
// differ only in "host": the request without "host", encoded once, then each
// participant's body from it (a copy with "host" put first; no re-encoding). Equal, as
// JSON, to EncodePrepare with that host.
std::string EncodeSharedPrepare(const PrepareRequest& request);
std::string PrepareForHost(const std::string& shared, int host);

// The decoded request and the old version's info, parsed. Checks the version, every
// field's type and range (host indexes inside addresses, to_version > from_version,
// a job name, one host per rank of both layouts) and that every new rank's host has
// an address; InvalidArgument naming the field otherwise.
struct DecodedPrepare {
  PrepareRequest request;
  StateInfo from;  // model and old config
};
Result<DecodedPrepare> DecodePrepare(std::string_view body);

// xxh64 (16 hex digits) of a canonical encoding of the plan: its tensor names, ops and
// kept regions in order. Equal plans have equal digests; any change of a box, rank,
// tensor index or order changes it (up to hash collisions).
std::string PlanDigest(const plan::Plan& plan);

}  // namespace tenplex::transform
