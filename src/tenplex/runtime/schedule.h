// Elastic schedules for `tenplex run`: a JSON list such as
//   [{"step": 0, "config": "tp=2,pp=2"},
//    {"step": 10, "config": "dp=3"},
//    {"step": 20, "config": "tp=2,dp=2", "kill_ranks": [1]},
//    {"step": 30, "stop": true}]
// Entry i runs its config from its step up to the next entry's step. `kill_ranks`
// on an entry kills those ranks of the *previous* entry's workers (SIGKILL) during the
// step before this entry's step. `kill_hosts` (with `tenplex run --cluster` only) makes
// those hosts of the cluster file fail at the same moment: their workers and their
// store daemon are killed, so the job goes on from the state on the other hosts. The
// last entry, and only it, is {"stop": true}. An entry may give {"gpus": N} instead of
// a config (optional "device_profile" and "gpu_memory"): the config policy
// (src/tenplex/policy) picks the config for N GPUs. `"slowdown": {"1": 2.0}` emulates
// slow devices from the entry's step on (until an entry gives another "slowdown"; {}
// ends it): the workers get --slowdown RANK=FACTOR (docs/hetero.md).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tenplex/model/model.h"
#include "tenplex/ptc/config.h"
#include "tenplex/util/status.h"

namespace tenplex::runtime {

struct ScheduleEntry {
  int64_t step = 0;
  bool stop = false;
  ParallelConfig config;  // unset when stop
  std::vector<int> kill_ranks;
  std::vector<int> kill_hosts;  // indexes into the cluster file's hosts
  int gpus = 0;                 // "gpus": N entries: the count the policy chose `config` for
  // "slowdown": rank -> factor (>= 1); unset when the entry gives none.
  std::optional<std::map<int, double>> slowdown;
  // "gpus": N entries: the policy's knobs for the workers (e.g. --micro-batch-size 4
  // --recompute-granularity full), appended to their command for this entry's segment.
  std::vector<std::string> worker_args;
};

// "1=2,3=1.5": the workers' --slowdown argument ("" when none).
std::string SlowdownArg(const std::map<int, double>& slowdown);

// Picks the config of a {"gpus": N, "device_profile": P, "gpu_memory": M} entry, and the
// worker arguments of its training knobs.
struct ChosenConfig {
  ParallelConfig config;
  std::vector<std::string> worker_args;
};
using ConfigChooser = std::function<Result<ChosenConfig>(
    int gpus, const std::string& device_profile, const std::string& gpu_memory)>;

// Parses and checks a schedule: a non-empty list, the first entry at step 0 with a
// config, steps strictly increasing, a stop entry last and nowhere else, configs valid
// for the model, kill ranks inside the previous config's world size and not on the
// first entry, kill hosts non-negative (the runner checks them against its cluster),
// no unknown fields; "gpus" entries resolved by `choose` (an error without one).
Result<std::vector<ScheduleEntry>> ParseSchedule(const std::string& json_text, const Model& model,
                                                 const ConfigChooser& choose = {});

}  // namespace tenplex::runtime
