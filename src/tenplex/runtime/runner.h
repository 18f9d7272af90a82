// The elastic runtime behind `tenplex run`: runs a training command through a
// schedule of parallel configs, keeping the job's state in a tensor store between
// configurations.
//
// For each schedule entry the runner opens a new store version laid out for the
// entry's config (zero-filled shared-memory tensors), writes two hand-off files and
// starts world-size workers, each as
//   CMD ARGS --config C --world-rank r --world-size n --master-port P
//            --start-step s --steps k --log LOG --state-out OUT.json [--state-in IN.json]
// IN.json / OUT.json ({"step", "samples_consumed", "config", "model", "ranks":
// [{"rank", "tensors": [{"name", "dtype", "shape", "file"}]}]}) name the shared-memory
// file of every local tensor: workers map them, load their state from IN and write
// their final state into OUT (no copies through pipes or sockets), and rank 0 writes
// OUT.json.result ({"step", "samples_consumed"}). When all workers exit 0 the runner
// commits the version; at a config change it transforms the committed version in the
// store (transform/local.h) and starts the next workers from it.
//
// With commit_every = N the workers also get --commit-every N --commit-prefix P: after
// every N-th step of the segment (not its last) they wait for the hand-off file
// P<step>.json, write their state into it and go on training; rank 0 writes
// P<step>.json.result, and the runner commits that version and opens the next one.
//
// kill_ranks: in the middle of the last step before an entry, the runner SIGKILLs those
// workers (the others are stopped too: a step cannot finish without them). The open
// version is dropped and the job resumes from the last committed version, re-running
// the steps since that commit, in the next entry's config. No disk checkpoint is
// involved.
//
// With a cluster file (--cluster), the state lives in the store daemons instead: rank r
// on host r / K, one version number on all hosts, and a config change is the
// distributed transform (cluster/distributed.h).
//
// Continuing a job: when the store (--shm-dir, or the daemons of --cluster) already
// holds a committed version of the job, the run continues from it: its step, samples
// consumed and config (transformed into the schedule's config for that step when they
// differ); the schedule position follows from the step. The run says so (notify, the
// log's {"event": "resume"} and the summary).
//
// The log (JSON lines) gets one line per completed step from the workers and one
// line per reconfiguration and failure from the runner. An existing log is appended
// to (as train.py does); the summary covers the lines this run added.
//
// The code: schedule_loop.h (the loop over segments), segment.h (one set of workers:
// commits, kills, failures), backend.h (embedded store or cluster daemons), handoff.h
// (files between runner and workers), process.h (the process seam), report.h.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tenplex/util/status.h"

namespace tenplex::runtime {

struct RunOptions {
  std::string schedule_path;
  std::string log_path;
  std::string model_path;            // model JSON or preset; default: --model in the command
  std::vector<std::string> command;  // the worker command and its own arguments
  std::string job = "train";
  std::string shm_dir;        // embedded store directory ("" = fresh private one)
  std::string work_dir;       // hand-off files and worker logs ("" = under the store dir)
  double hang_seconds = 300;  // no progress for this long: the run fails
  std::string baseline_log;   // a static run's log to compare losses with
  // The store daemons of a cluster file instead of the embedded store (all on this
  // machine: workers map their host daemon's shared memory); needs work_dir.
  std::string cluster_path;
  std::string token;  // of the daemons (TENPLEX_TOKEN when empty)
  // Every this many steps inside a segment the workers also write their state into a
  // new store version, which the runner commits while they train on (0: only at the
  // segment's end). A failure then re-runs only the steps since the last commit.
  int64_t commit_every = 0;
  // Keep workers alive across reconfigurations (warm.h): workers of ranks that exist
  // in both worlds re-join the new one in the same process, survivors of a scheduled
  // kill too; only added ranks start new processes. The command must speak the
  // --warm-control protocol (examples/gpt/train.py does).
  bool warm = false;
  // With a cluster: once a segment has a committed state, the hosts make the new
  // tensors of the next entry's config ahead, while it trains (StateBackend::
  // PresizeAhead), so the transform after it does not allocate them (--no-presize: off).
  bool presize = true;
  // --rebalance: every rebalance_window steps the workers commit, and the runner reads
  // their rank_seconds; when the rebalance policy (rebalance.h) predicts that an
  // uneven split (tp_weights, dp_weights, layers=) proportional to the measured speeds
  // gains more over the entry's remaining steps than a reconfiguration costs, it stops
  // the workers at that commit, transforms the state and goes on in the new split,
  // logging {"event": "rebalance", ...}. Schedule entries whose config differs only in
  // weights or layers keep the rebalanced split.
  bool rebalance = false;
  int64_t rebalance_window = 3;
  double rebalance_min_gain = 0.08;  // relative step-time gain below which nothing changes
  double rebalance_cost = -1;        // >= 0: assume this reconfiguration cost (s), not the measured
  // Messages for the person running it (continuing a job, where a failed worker's log
  // was kept); none when empty.
  std::function<void(const std::string&)> notify;
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0;
  std::string config;
  std::vector<int64_t> samples;
  double seconds = 0;                // the step's wall time, as the worker logged it
  std::vector<double> rank_seconds;  // each rank's own compute (examples/gpt/meter.py)
};

struct ReconfigureRecord {
  int64_t step = 0;
  std::string from, to;
  bool after_failure = false;
  std::vector<int> killed;
  double stop_seconds = 0, transform_seconds = 0, restart_seconds = 0;
  // End to end: from the old config's last step (after a failure: the kill) to the first
  // step done in the new one. With --warm the transform runs while the workers re-join
  // (overlapped), so the three parts can add up to more.
  double seconds = 0;
  int64_t bytes_moved = 0, bytes_total = 0, bytes_in_place = 0;
  // Pre-sized ahead while the old config trained (not in `seconds`): the new bytes the
  // hosts could pool and those their pools held, and how long it took.
  int64_t presize_poolable_bytes = 0, presize_pooled_bytes = 0;
  double presize_seconds = 0;
  // After a failure: the step that was running, how many finished steps were lost
  // (re-run from the last commit) and the seconds from the kill until that step was
  // done again.
  int64_t failed_step = 0, lost_steps = 0;
  double recovered_seconds = 0;
};

struct RunSummary {
  std::vector<StepRecord> steps;  // last line per step
  std::vector<ReconfigureRecord> reconfigurations;
  std::optional<double> max_loss_deviation;  // relative, against the baseline
  std::optional<int64_t> sample_mismatches;  // steps whose samples differ from the baseline
  double seconds = 0;
  // The committed version this run continued from, and its step.
  std::optional<uint64_t> resumed_version;
  int64_t resumed_step = 0;
};

Result<RunSummary> Run(const RunOptions& options);

// Reads a run log from byte `offset` on: the last line per step, in step order.
Result<std::vector<StepRecord>> ReadStepLog(const std::string& path, uint64_t offset = 0);

// The table a person reads: steps, configs, losses, reconfigurations with their time
// split, and the deviation from the baseline.
std::string SummaryTable(const RunSummary& summary);
// The same as one JSON object (`tenplex run --json`): {"steps": [{"step", "loss",
// "config", "samples"}], "reconfigurations": [...], "seconds", "resumed_version",
// "resumed_step", "max_loss_deviation", "sample_mismatches"} (null when not known).
std::string SummaryJson(const RunSummary& summary);

}  // namespace tenplex::runtime
