// Sampled hosts (sim.mode "sample", docs/scale.md): instead of the full plan, the per-host
// plan (plan::MakeHostPlan) of one host of each kind. Two hosts are of one kind when their
// ranks have the same coordinates: each new rank's (tp, pp) rank (and dp rank with
// ZeRO-1, whose flat shards depend on it), with the coordinates of the old rank of the
// same number when that rank is on the host too (the same device: what stays in place),
// and the coordinates of every old rank on the host. Then the elements a host needs and
// does not hold, what it keeps, copies locally and links are the same for every host of
// the kind: its row is the representative's. What each host sends is not (the planner
// takes a box's holders in turn, over all receivers): it is estimated as the
// total received bytes spread evenly over the hosts that hold old ranks, and a host's
// sources as its representative's, shifted by the distance between the two hosts.
#pragma once

#include <cstdint>

#include "tenplex/model/model.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/sim/simulate.h"

namespace tenplex::sim {

// Heap bytes in use (glibc: small blocks plus mmapped ones): what a live plan holds,
// whatever pages malloc reuses from earlier work (resident memory would not grow then).
int64_t HeapBytes();

// Fills r.traffic, r.plan (sums over the kinds), r.costs.plan_s and plan_heap (the
// slowest representative's per-host plan) and r.sampled_kinds; the placement in r must
// be set. InvalidArgument when there are more than max_kinds kinds of hosts.
Status SampleHosts(const Model& model, const Layout& from, const Layout& to, int max_kinds,
                   SimResult& r);

}  // namespace tenplex::sim
