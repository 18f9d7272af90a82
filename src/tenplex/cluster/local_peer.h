// Same-host reads between store daemons (docs/transport.md, "Same-host peers").
//
// Daemons of one machine used to fetch each other's committed tensors over UCX-over-TCP
// (UCX 1.13's shared-memory transports cannot detect a dead peer). When a peer is on
// this machine and its shared-memory directory is visible here, a transform reads the
// peer's tensor files directly instead (transport/peer_files.h): the reader asks the
// peer, over its authenticated HTTP API and with the transform's capability, which
// files hold the tensors it needs (POST /v1/transform/locate, answered only for the
// committed tensors the capability covers), opens exactly those files read-only and
// preads its boxes into the new tensors. Failure detection stays with the peer's HTTP
// health: while the reads run, the peer's GET /v1/health is polled (every 100 ms), and
// once more after the last byte; a peer that stops answering, or that answers as
// another process (restarted), fails the read with UNAVAILABLE naming it, as a broken
// data-plane connection would, so the coordinator aborts and re-plans exactly as
// before.
//
// Whether a peer qualifies (LocallyReadable): it offered it (its address reply has a
// "local" object, turned off by `store serve --no-local-peer-reads`), it runs on the
// same kernel (boot id) and this process sees its directory (the STORE_ID file there
// holds the peer's store id: not so in another mount namespace, or on another host).
// Otherwise the data plane is used.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tenplex/cluster/control_protocol.h"
#include "tenplex/transport/transport.h"
#include "tenplex/util/status.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::cluster {

// True when this process can read `peer`'s files directly (see above).
bool LocallyReadable(const LocalPeer& peer);

struct LocalReadOptions {
  std::string token;       // bearer token of the peer's HTTP API ("" for none)
  std::string capability;  // of the transform (transport/capability.h)
  int timeout_s = 10;      // a control call (locate, health) that takes longer fails
  int health_interval_ms = 100;
};

// Reads every run of `requests` (regions: the peer's store paths) from the peer's
// files. UNAVAILABLE when the peer does not answer (before, during or right after the
// reads) or restarted; other errors as the peer or the file checks give them
// (PermissionDenied for a capability it refuses, FailedPrecondition for a file that
// is not the one it named, OutOfRange for a run past a file's end). Returns the bytes
// read. On error the destinations are unspecified.
Result<uint64_t> ReadFromLocalPeer(const LocalPeer& peer,
                                   const std::vector<transport::ReadRequest>& requests,
                                   const LocalReadOptions& options, ThreadPool* pool);

}  // namespace tenplex::cluster
