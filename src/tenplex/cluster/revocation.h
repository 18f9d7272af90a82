// The end of a transform on every host it touched (issue 35: revocation of data-plane
// capabilities, transport/capability.h).
//
// A transform's capabilities (V -> W) stay valid on a serving store until they expire,
// or until that store committed W (its current version is W or newer) or closed the
// transform (store::JobInfo::closed >= W). The participants that commit W need nothing
// more; a store that drops an uncommitted W (an abort) closes it itself. The others, the
// hosts that got no ranks of W and only gave tensors away, the participants whose
// commit is unconfirmed and those that never began W, hear it from CloseTransform:
// one small request each (POST /v1/jobs/J/versions/W/close), all at once, after the
// coordinator's decision (commit or abort) and after a recovery's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tenplex/store/client.h"

namespace tenplex::cluster {

// Tells `hosts` (indexes into clients; null clients and repeats skipped) that the
// transforms of job to `version` and older are over. Best effort: a host that does not
// answer or lacks the job is skipped (its capabilities then die when they expire).
// Returns how many hosts confirmed.
int CloseTransform(const std::vector<store::Client*>& clients, std::vector<int> hosts,
                   const std::string& job, uint64_t version);

// The hosts among 0..n-1 that are not in `except`.
std::vector<int> HostsExcept(std::size_t n, const std::vector<int>& except);

}  // namespace tenplex::cluster
