// The input of `tenplex simulate` (docs/scale.md): a JSON scenario.
//
//   {"model": "gpt3-175b" | "path/model.json" | {<model JSON, model.h>},
//    "from": {"config": "tp=8,pp=16,dp=8", "gpus_per_host": 8},
//    "to":   {"config": "tp=8,pp=16,dp=7", "gpus_per_host": 8, "hosts": 128},
//    "cluster": {"nic_gbit_s": 200, "latency_us": 5, "copy_gbyte_s": 20,
//                "memory_gbyte_s": 10, "map_gbyte_s": 50, "hash_gbyte_s": 0, "rpc_us": 50,
//                "stragglers": [{"host": 3, "factor": 2.0}], "lost_hosts": [5],
//                "pfs_gbyte_s": 1000, "presized": false},
//    "sim": {"mode": "auto" | "full" | "sample", "full_max_ranks": 40000,
//            "max_kinds": 256}}
//
// Placement, as `tenplex transform --cluster` places ranks (cluster/distributed.h):
// old rank r lives on host r / from.gpus_per_host. The target cluster is hosts
// 0 .. to.hosts-1 (default: the old hosts, plus as many more as the new config needs);
// new rank r goes on the (r / to.gpus_per_host)-th of its hosts that is not lost. A lost
// host's old ranks are unavailable (plan::kLostHost): the planner re-plans from replicas.
// Everything except model and the two configs has a default (simulate.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tenplex/model/model.h"
#include "tenplex/ptc/config.h"
#include "tenplex/util/status.h"

namespace tenplex::sim {

struct ClusterModel {
  double nic_gbit_s = 100;        // per host, each direction
  double latency_us = 10;         // one way, host to host
  double copy_gbyte_s = 10;       // intra-host copy (memcpy between tensors)
  double memory_gbyte_s = 10;     // first touch of new tensors; checksums when sealing
  double map_gbyte_s = 50;        // mapping and pre-faulting resident pages (no copy)
  double hash_gbyte_s = 0;        // checksums of the new tensors when sealing; 0: memory_gbyte_s
  double rpc_us = 100;            // fixed cost of one request (both ends), besides latency
  double json_gbyte_s = 0;        // 0: measured here (parse of the real info text)
  std::vector<double> straggler;  // per host: every phase of the host x factor (1: none)
  std::vector<int> lost_hosts;    // old hosts whose state is gone
  double pfs_gbyte_s = 0;         // aggregate parallel-FS read bandwidth; 0: no comparison
  double lost_detect_s = 0;       // per lost host, before it is given up (0: refused at once)
  bool presized = false;          // new tensors pre-sized in the page pools (transform --presize)
  // Threads the coordinator plans and digests on (MakePlan and HostPlanParts split their
  // work: planner.h, "Parallel"); 0: this machine's hardware threads, measured as is.
  int coordinator_threads = 0;
  double Straggler(int host) const {
    return host >= 0 && static_cast<std::size_t>(host) < straggler.size() ? straggler[host] : 1.0;
  }
};

enum class SimMode { kAuto, kFull, kSample };

struct Scenario {
  std::string model_spec;             // preset name or file (when model is a string)
  std::optional<Model> inline_model;  // when model is an object
  ParallelConfig from, to;
  int from_gpus_per_host = 8;
  int to_gpus_per_host = 8;
  int to_hosts = 0;  // 0: default (see above)
  ClusterModel cluster;
  SimMode mode = SimMode::kAuto;
  int full_max_ranks = 40000;  // auto: the full plan up to this many old + new ranks
  int max_kinds = 256;         // sample: at most this many kinds of hosts (sample.h)
};

// Largest numbers a scenario may hold (a bound against absurd input, not a promise
// that such a size runs quickly): hosts, ranks, straggler factor.
inline constexpr int kMaxSimRanks = 1 << 20;
inline constexpr double kMaxStraggler = 1000;

// Parses the scenario text: InvalidArgument naming the field for malformed JSON, a
// missing or mistyped field, a config that does not parse, a number out of range (a
// bandwidth <= 0, a straggler factor < 1, a host < 0, more than kMaxSimRanks ranks).
// The model is not loaded here (ResolveModel).
Result<Scenario> ParseScenario(const std::string& text);

// The scenario's model: the inline one, or LoadModel(model_spec).
Result<Model> ResolveModel(const Scenario& s);

}  // namespace tenplex::sim
