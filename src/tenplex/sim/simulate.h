// Predicts a distributed transform (`tenplex transform --cluster`, cluster/distributed.h)
// on a cluster we do not have: `tenplex simulate` (docs/scale.md).
//
// What is real and what is modelled. The bytes are the planner's: the simulator runs
// plan::MakePlan on the scenario's layouts and host maps (what the coordinator and every
// agent run) and counts each host's ops the way the executor splits them (traffic.h).
// (With sampled hosts, sample.h: plan::MakeHostPlan of one host per kind instead, the
// same bytes for every host of the kind; what each host sends is estimated.)
// The costs that are computation are measured here, by running the code the transform
// runs: the plan (time and heap memory), every host's digest of its part
// (cluster::HostPlanParts), one host's part (plan::MakeHostPlan, what each agent
// plans), one
// prepare request of the scenario's real size (cluster::EncodePrepare, with the state
// info, addresses, host maps and same-host peers a cluster of that size sends) and its
// decoding (cluster::DecodePrepare, what every agent does first), and a JSON parse of
// the state info (the replies of the control requests carry it). Only the hardware is
// modelled, by the cluster description (scenario.h) and these formulas:
//
//   B = nic_gbit_s·1e9/8 bytes/s per host and direction, L = latency (one way),
//   R = rpc_us (the fixed cost of one request), C = copy_gbyte_s, M = memory_gbyte_s,
//   W = map_gbyte_s (mapping and pre-faulting pages that are resident: no bytes copied),
//   H = hash_gbyte_s (xxh64 checksums of the new tensors; default M),
//   J = json_gbyte_s (default: measured), s_h = host h's straggler factor (>= 1),
//   N = hosts asked, P = participants (hosts with new ranks, index p = 0 .. P-1).
//
// Coordinator, before the prepare (distributed.cc, job_listing.h, job_lease.h): each
// step asks every host with k = kControlConcurrency (64) requests in flight, so a step
// over n hosts takes ⌈n/k⌉ round trips rt = R + 2L: connect (health), the job's lease
// (the first host alone, then the rest), the job's listing and the data-plane address.
// The listing's replies carry the info's digest, not the info (I bytes: model, config
// and the cluster's URLs, growing with N); each daemon parses its info to digest it
// (I/J, in parallel across hosts), and the coordinator fetches the info once:
//   control = rt·(3⌈N/k⌉ + 1 + ⌈(N-1)/k⌉) + ⌈N/k⌉·I/J + (rt + I/B + I/J)
//             + lost_hosts·lost_detect_s
// (Before issue 36's fix: 6 requests per host one after the other, 3 of them carrying
// the info: N·6·rt + N·3·I·(1/B + 1/J), O(N²); `docs/scale.md` shows both.)
//   coordinator plan = plan_s + digest_s                  (MakePlan, HostPlanParts)
//            on the coordinator's threads: measured on this machine's, and fitted from
//            one thread and this machine's when the scenario names another number
// Prepare round: the coordinator encodes the request once (Q bytes; only "host" and its
// part differ per participant) and sends every participant its copy, through its one NIC;
// participant p starts at
//   start_p = encode_s + (p + 1)·Q/B + L + R
// and then, on its own (phases sequential, every one × s_h, as agent.cc runs them):
//   decode = decode_s;  plan = host_plan_s (each agent plans its own part: the critical
//            host's MakeHostPlan, measured, stands for every host's; before issue 36's
//            fix every agent planned the whole transform, plan_s);
//   warm   = out_h / W  (pre-faulting what peers fetch);
//   alloc  = new_h / M  (first touch of the new tensors; 0 when presized: the pages were
//            pooled ahead while the old config trained, transform --presize)
//   fetch  = max(in_h·s_h, max over its sources x of out_x·s_x) / B
//            + R·(peers_in_h + peers_out_h) + 2L     (0 without remote bytes)
//   local  = (kept_h + local_h) / C                 (overlaps the fetches: host_exec.h)
//   exec   = max(fetch, local) + landed_h / C;  seal = new_h / H  (checksums)
//   prepare_h = decode + plan + warm + alloc + exec + seal
//   round  = max_p (start_p + prepare_p + L)          -> the critical host
// Commit (two_phase.h): the first participant alone, then the rest k at a time, then
// the release of the old versions (participants) and of the lease (every host):
//   commit = rt·(1 + ⌈(P-1)/k⌉);   release = rt·(⌈P/k⌉ + ⌈N/k⌉)
//   total  = control + coordinator plan + round + commit + release
// Restart from a checkpoint, for comparison: every new rank reads its tensors from the
// parallel file system, new-layout bytes / pfs_gbyte_s, or (a lower bound) the state is
// read once and broadcast, GlobalBytes / pfs_gbyte_s: the read alone (no job restart,
// no framework start-up, no broadcast; those come on top).
//
// Limits (docs/scale.md): no contention inside the network (a full-bisection fabric:
// only the NICs limit), no congestion or incast effects beyond the NIC rates, one NIC
// per host, the straggler factor slows a host's every phase alike, the control requests'
// reply sizes are the info's (a job with many kept versions replies with more), and a
// lost host is lost before the transform (refused at connect; lost_detect_s per lost
// host models a silent one, e.g. the 10 s control timeout). Page-cache and first-touch
// effects are in M; GPU copies are not modelled (the store's tensors are host memory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tenplex/sim/scenario.h"
#include "tenplex/sim/traffic.h"

namespace tenplex::sim {

// Costs of computation, measured once (identical on every host but for s_h).
struct MeasuredCosts {
  // MakePlan on the coordinator's threads (or, sampled, the slowest per-host plan), and
  // HostPlanParts of that plan (every host's digest); from the measurements below.
  double plan_s = 0;
  int64_t plan_heap = 0;  // heap bytes the live plan holds (mallinfo2)
  double digest_s = 0;
  // Full mode, measured here on `threads` (this machine's hardware threads) and, when
  // the coordinator has another number, on one (alternated, the fastest of two or three
  // each, after an untimed plan: simulate.cc, TimePlanThreads); the coordinator's time is
  //   serial + parallel / coordinator_threads, where serial + parallel = one-thread time
  //   and serial + parallel / threads = the time on `threads` (Amdahl, fitted).
  int threads = 1;
  double plan_here_s = 0, plan_one_s = 0, digest_here_s = 0, digest_one_s = 0;
  double encode_s = 0;         // EncodePrepare of one request
  double decode_s = 0;         // DecodePrepare of one request
  int64_t request_bytes = 0;   // one encoded prepare request
  int64_t info_bytes = 0;      // the state info (in the control replies)
  double json_s_per_byte = 0;  // parse of the info text, per byte
  // plan::MakeHostPlan for the critical host (full mode; sampled: the slowest kind's),
  // what each agent spends planning its own part.
  double host_plan_s = 0;
  int64_t host_plan_heap = 0;
};

struct HostTimes {
  double start = 0;  // when its prepare request arrived (seconds into the round)
  double decode = 0, plan = 0, warm = 0, alloc = 0, fetch = 0, local = 0, landed = 0, seal = 0;
  double prepare = 0;  // decode + plan + warm + alloc + max(fetch, local) + landed + seal
};

struct Prediction {
  std::vector<HostTimes> hosts;  // by host index (zero for non-participants)
  double control = 0, coordinator_plan = 0, round = 0, commit = 0, release = 0, total = 0;
  int critical_host = -1;  // the participant whose prepare ends last
};

struct SimHosts {
  int asked = 0;                  // N: every host of both clusters, lost ones included
  std::vector<int> participants;  // hosts with new ranks, in order
  int lost = 0;
};

// The formulas above: a pure function of the traffic, the hardware and the measured
// costs (tested against hand-computed values).
Prediction Predict(const std::vector<HostTraffic>& traffic, const SimHosts& hosts,
                   const ClusterModel& cluster, const MeasuredCosts& costs);

struct SimResult {
  std::string model, from_config, to_config;
  int from_ranks = 0, to_ranks = 0;
  std::vector<int> from_hosts, to_hosts;  // rank -> host (plan::kLostHost)
  SimHosts hosts;
  ClusterModel cluster;
  std::string mode;       // "full", or "sample" (sample.h)
  int sampled_kinds = 0;  // sample: kinds of hosts, one per-host plan each
  plan::PlanStats plan;
  std::vector<HostTraffic> traffic;
  MeasuredCosts costs;
  Prediction prediction;
  int64_t checkpoint_bytes = 0;  // the new layout's bytes (every rank reads its shards)
  double checkpoint_s = 0;       // / pfs_gbyte_s (0 without one)
  int64_t state_bytes = 0;       // the model's state once (GlobalBytes: read once, broadcast)
  double state_s = 0;            // / pfs_gbyte_s
};

// Loads the model, places the ranks, runs the planner and the measurements, predicts.
// Errors: InvalidArgument for an impossible config or placement (naming it), DataLoss
// when a lost host held the only replica of some state (the planner's message).
Result<SimResult> Simulate(const Scenario& scenario);

// {"scenario": {...}, "plan": {...}, "measured": {...}, "prediction": {...},
//  "hosts": [per host bytes and phase times], "checkpoint_restart": {...}}
std::string SimResultToJson(const SimResult& r);
// A few lines a person reads: totals, phases, the critical host, the comparison.
std::string SimSummary(const SimResult& r);

}  // namespace tenplex::sim
