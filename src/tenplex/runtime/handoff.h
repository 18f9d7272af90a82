// The files between the runner and its workers (the worker's side is
// python/tenplex/handoff.py; examples/gpt/train.py is the reference worker).
//
// Segment K of a run (its workers' lifetime) uses, in the work directory:
//   state-in-K.json             the committed version's files (not in the first segment)
//   state-out-K.json            the version the workers write at the segment's end
//   commit-segK-step<S>.json    with --commit-every N: the version written after step S
//   worker-segK-rankR.log       rank R's stdout and stderr
// A hand-off file is {"step", "samples_consumed", "config", "model", "ranks": [{"rank",
// "tensors": [{"name", "dtype", "shape", "file"}]}]}: the shared-memory file of every
// local tensor. When the workers have written a version, rank 0 writes
// <file>.result = {"step", "samples_consumed"}.
//
// Workers are started as
//   CMD ARGS --config C --world-rank r --world-size n --master-port P --start-step s
//            --steps k --log LOG --state-out OUT [--commit-every N --commit-prefix P]
//            [--state-in IN] [--slowdown RANK=FACTOR,...] [--warm-control P]
// and log one JSON line per completed step ({"step", "loss", ...}, rank 0) to LOG.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tenplex/ptc/layout.h"
#include "tenplex/runtime/backend.h"
#include "tenplex/util/status.h"

namespace tenplex::runtime {

// The names of segment `segment`'s files in `work_dir`.
struct SegmentFiles {
  SegmentFiles(const std::string& work_dir, int segment);
  std::string out_json, in_json, commit_prefix;
  std::string WorkerLog(int rank) const;

 private:
  std::string work_, seg_;
};

// A version the workers write: after step `step`, into hand-off file `path`.
struct Target {
  int64_t step = 0;
  std::string path;
};

// Where the workers of a segment from step `start` to `end` write their state, in
// order: with commit_every = N > 0 after every N-th step (not the last), then at the
// end (files.out_json).
std::vector<Target> SegmentTargets(const SegmentFiles& files, int64_t start, int64_t end,
                                   int64_t commit_every);

// The hand-off JSON of version v: `info` plus every rank's tensors and their files.
Result<nlohmann::json> HandoffJson(StateBackend& st, const std::string& job, uint64_t v,
                                   const Layout& layout, const io::StateInfo& info);

// What rank 0 wrote into <target>.result: DataLoss when it is malformed or for
// another step.
struct WorkerResult {
  int64_t step = 0;
  int64_t samples_consumed = 0;
};
Result<WorkerResult> ReadWorkerResult(const Target& target);

// The command line of worker `rank` (see above).
struct WorkerArgs {
  std::string config;
  int world_size = 1;
  int port = 0;
  int64_t start_step = 0, steps = 0;
  std::string log, state_out, commit_prefix;
  int64_t commit_every = 0;
  std::optional<std::string> state_in;
  std::string slowdown;            // --slowdown (schedule "slowdown"), none when empty
  std::string warm_control;        // --warm-control (warm.h), none when empty
  std::vector<std::string> extra;  // last: the schedule entry's worker_args
};
std::vector<std::string> WorkerArgv(const std::vector<std::string>& command, const WorkerArgs& args,
                                    int rank);

}  // namespace tenplex::runtime
