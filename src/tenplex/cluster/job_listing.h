// What every host of a cluster holds of one job, read once and all at once: the control
// phase of a coordinator at thousands of hosts.
//
// A coordinator's attempt needs three things from every host: what a crash left half
// done (ResolvePending), the newest committed version and who holds it
// (FindCommittedState) and a version number above every one in use
// (NextCommonVersion). Each used to read the job from every host on its own, one host
// after the other, and every reply carries the versions' infos, which hold the
// placement and so grow with the cluster (about 1 MB at 12,000 hosts): three sequential
// O(N) passes of O(N) bytes each, 98 % of the predicted time of a 100k-GPU transform
// (docs/scale.md). ReadJobListing asks every host once, up to kControlConcurrency
// requests in flight, for its versions with their infos' xxh64 instead of the infos
// (GET /v1/jobs/J?info=digest: a few hundred bytes), then fetches each distinct info
// once, from one host that listed it (the hosts of one version hold the same info):
// O(N) small replies plus the few distinct infos, and memory O(N + distinct infos), not
// O(N·I). Equal digests stand for equal infos (xxh64 of the canonical JSON; a collision
// is not guarded against). The three readers then work on the listing; the coordinator
// reads it again only when its recovery changed something.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tenplex/store/client.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

struct ListedVersion {
  uint64_t version = 0;
  bool committed = false, prepared = false;
  int info = -1;  // index into JobListing::infos
};

struct HostListing {
  // Ok, NotFound (the host has no such job: it answered), Unavailable (no answer, or a
  // null client), or another error of that host's reply (context: its URL).
  Status status;
  std::optional<uint64_t> current;
  std::vector<ListedVersion> versions;  // increasing
  uint64_t last = 0;                    // the highest number it has had (store::JobInfo)
};

struct JobListing {
  std::vector<HostListing> hosts;  // one per client
  std::vector<std::string> infos;  // the distinct info texts

  // Host h's entry for version v, or null.
  const ListedVersion* Find(std::size_t h, uint64_t v) const;
  // One past every version any host reports or has had (at least 1): a number rolled
  // back is not used again for other content.
  uint64_t NextVersion() const;
};

JobListing ReadJobListing(const std::vector<store::Client*>& clients, const std::string& job);

}  // namespace tenplex::cluster
