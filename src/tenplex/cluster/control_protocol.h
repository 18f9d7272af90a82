// The control-plane protocol between a transform's coordinator (distributed.h) and
// the transform agent of every daemon (agent.h): the prepare request of phase one.
//
// Protocol version 3. `POST /v1/transform/prepare` carries one JSON object:
//   {"host": 2,                          the receiver's index into addresses
//    "host_plan_digest": "0123456789abcdef",
//                                        PlanDigest of the receiver's part of the
//                                        coordinator's plan (HostPlanParts); new in 3
//    "served": [[5, 17, 0], ...],        [old rank, local tensor, reading host]: the
//                                        receiver's old tensors that ops of other hosts
//                                        read (HostPlanParts), distinct, ascending; new
//                                        in 3
//    "protocol": 3,                      this header's kControlProtocolVersion
//    "job": "j", "from_version": 3, "to_version": 4,
//    "info": {...},                      the old version's info (state_info.h)
//    "to_config": "tp=2,pp=2,dp=1",
//    "new_info": {...},                  the info the new version is begun with
//    "addresses": ["...", "", ...],      data-plane address per host ("": lost)
//    "from_hosts": [0, -1, ...],         old rank -> host (-1: lost)
//    "to_hosts": [0, 0, 1, ...],         new rank -> host
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
// The first three fields differ between participants; the rest is the same for all
// (EncodeSharedPrepare). Unknown fields are refused. Correctness rests on every host
// computing its part of the same plan from these inputs (no plan is shipped): the
// coordinator plans the whole transform and sends each host the digest of that host's
// part, and the agent plans its own part only (plan::MakeHostPlan, whose ops are
// exactly those of the whole plan with a destination on the host) and refuses
// (FailedPrecondition) to run a part whose digest differs: a daemon of another build
// must not silently execute a different plan. "served" is what the agent alone cannot
// know without the other hosts' parts: which of its tensors peers will read, which it
// maps and pre-faults ahead (a wrong list costs time, not correctness). Version 2 sent
// the digest of the whole plan ("plan_digest"), and every agent planned the whole
// transform. A request of another protocol version is refused the same way, naming
// both versions. Changing any of this, or any reply (control_replies.h: the typed
// replies of prepare, presize, probe, address and locate), means a new
// kControlProtocolVersion.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/io/state_info.h"
#include "tenplex/plan/planner.h"
#include "tenplex/ptc/config.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

inline constexpr uint32_t kControlProtocolVersion = 3;

// A host that offers same-host reads of its committed tensors (agent.h): its store
// URL (for the control calls and its health), the boot id of its machine, its
// shared-memory directory and the id in that directory's STORE_ID file.
struct LocalPeer {
  std::string url, host_id, shm_dir, store_id;
  bool empty() const { return url.empty(); }
};

// An old tensor of a host that a peer reads from it in a transform: old rank, index of
// its local tensor, and the host of the reading new rank.
struct ServedTensor {
  int rank = 0, tensor = 0, reader = 0;
  auto operator<=>(const ServedTensor&) const = default;
};

// What differs between the participants' requests besides "host".
struct HostPart {
  std::string plan_digest;  // "host_plan_digest"
  std::vector<ServedTensor> served;
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
  std::string host_plan_digest;           // of this host's part of the plan (HostPart)
  std::vector<ServedTensor> served;       // ascending (HostPart)
  std::vector<LocalPeer> local_peers;     // empty, or one per address (empty() for none)
  std::vector<std::string> incarnations;  // one per address ("": none known)
};

std::string EncodePrepare(const PrepareRequest& request);

// The same in two steps, for a round with thousands of participants whose requests
// differ only in "host" and its HostPart: the rest, encoded once, then each
// participant's body from it (a copy with those put first; no re-encoding). Equal, as
// JSON, to EncodePrepare with that host and part.
std::string EncodeSharedPrepare(const PrepareRequest& request);
std::string PrepareForHost(const std::string& shared, int host, const HostPart& part);

// The decoded request and the old version's info, parsed. Checks the version, every
// field's type and range (host indexes inside addresses, to_version > from_version,
// a job name, one host per rank of both layouts, "served" entries of old ranks on the
// receiver read by other hosts) and that every new rank's host has an address;
// InvalidArgument naming the field otherwise. (The tensor index of a "served" entry is
// checked against the layout by the agent.)
struct DecodedPrepare {
  PrepareRequest request;
  StateInfo from;  // model and old config
};
Result<DecodedPrepare> DecodePrepare(std::string_view body);

// xxh64 (16 hex digits) of a canonical encoding of the plan: its tensor names, ops and
// kept regions in order. Equal plans have equal digests; any change of a box, rank,
// tensor index or order changes it (up to hash collisions).
std::string PlanDigest(const plan::Plan& plan);

// The HostPart of every host 0 .. hosts-1 from the whole plan (one pass over it, no
// copy): the PlanDigest of the host's part (its ops and kept regions whose destination
// rank is on it, in order, `after` renumbered to indices of its ops, which is what
// plan::MakeHostPlan returns for it) and the old tensors on it that ops of other hosts
// read. REQUIRES: the host maps are the plan's, with hosts in [0, hosts) (from_hosts
// may hold plan::kLostHost). threads: the hosts are split into that many ranges, each
// digested on its own thread; 0: one per hardware thread for 65,536 ops or more, else
// one. Every count gives the same parts.
std::vector<HostPart> HostPlanParts(const plan::Plan& plan, const std::vector<int>& from_hosts,
                                    const std::vector<int>& to_hosts, std::size_t hosts,
                                    int threads = 0);

}  // namespace tenplex::cluster
