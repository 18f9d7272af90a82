// One segment of a run: the lifetime of one set of workers, from a committed state
// (or none) in one parallel config to the segment's end step.
//
// States, in order:
//   kOpening    opens the first version the workers write (hand-off files, the
//               committed version's files as --state-in) and starts world-size workers
//   kRunning    follows the log; when the workers have written a periodic commit
//               (--commit-every) commits that version and opens the next; kills the
//               scheduled ranks and hosts in the middle of the step before the end
//   kCompleted  every worker exited 0 and wrote the last version: it is committed
//   kStopped    after a periodic commit, stop_after_commit asked for a stop (a
//               rebalance): the workers are stopped (with a pool: told to abort the
//               step in progress, they park for the next segment), the open version
//               dropped, the job goes on from that commit (step())
//   kKilled     the scheduled kill struck: the open version is dropped, the job goes
//               on from the last commit (step()), re-running the steps since
//   kFailed     Run() returned an error: an unscheduled worker failure (with the
//               end of its output), no progress for hang_seconds, SIGINT/SIGTERM, or a
//               store error. Workers are stopped and the open version is dropped; the
//               last committed version stays.
// Versions are opened one at a time and committed in step order, so at most one is
// open. REQUIRES: an InterruptGuard is alive while Run() runs.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tenplex/ptc/layout.h"
#include "tenplex/runtime/backend.h"
#include "tenplex/runtime/handoff.h"
#include "tenplex/runtime/process.h"
#include "tenplex/runtime/report.h"
#include "tenplex/runtime/runner.h"
#include "tenplex/runtime/warm.h"

namespace tenplex::runtime {

// What a segment works with; all outlive the segment.
struct SegmentEnv {
  const RunOptions* options = nullptr;
  StateBackend* backend = nullptr;
  ProcessLauncher* launcher = nullptr;
  RunRecorder* recorder = nullptr;
  // Where a failed worker's log is copied when the work directory goes away with the
  // run (StateBackend::work_dir_kept() false); empty: the log stays where it is.
  std::string kept_logs_dir;
  // --warm: workers of earlier segments parked here are reused, and this segment's
  // workers are parked here at its end or after a scheduled kill (warm.h); nullptr:
  // every segment starts its workers and they exit at its end.
  WarmPool* pool = nullptr;
};

struct SegmentSpec {
  int index = 0;  // numbers the segment's files (handoff.h)
  const Layout* layout = nullptr;
  int64_t start = 0, end = 0;  // the steps [start, end)
  int64_t samples_consumed = 0;
  io::StateInfo info;                 // the versions' info: model, config, ...
  std::optional<uint64_t> committed;  // the version the workers load, if any
  std::vector<int> kill_ranks;        // killed in the step before `end`
  std::vector<int> kill_hosts;
  int64_t commit_every = 0;              // periodic commits inside the segment (0: only at its end)
  std::string slowdown;                  // the workers' --slowdown, none when empty
  std::vector<std::string> worker_args;  // appended to the workers' command (policy knobs)
  // With a pool: the world size of the segment after this one (0: none or unknown);
  // the workers it adds beyond this segment's survivors are started ahead as spares.
  int next_world = 0;
  // Called after each periodic commit with its step; true stops the segment there.
  std::function<bool(int64_t step)> stop_after_commit;
  // With a pool: makes the version the workers load (`committed` is then not used) and
  // returns it. Called once the workers have their arguments, so that the transform
  // overlaps their re-joining the new world (they wait for their --state-in file); the
  // segment's first version is begun after it (versions commit in the order begun).
  std::function<Result<uint64_t>()> transform_in;
  // Called once, as soon as the segment has a committed version in its config (after
  // the launch when it loads one, else after its first periodic commit): the state a
  // transform at its end starts from is laid out as that one. Must return at once (the
  // schedule loop starts pre-sizing the next config from it, StateBackend::PresizeAhead).
  std::function<void()> on_state;
};

class Segment {
 public:
  enum class State { kOpening, kRunning, kCompleted, kStopped, kKilled, kFailed };

  Segment(SegmentEnv env, SegmentSpec spec);
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Runs the segment to kCompleted or kKilled, or returns the error of kFailed.
  Status Run();

  State state() const { return state_; }
  // The last committed step, its samples and version (the start's when none).
  int64_t step() const { return step_; }
  int64_t samples_consumed() const { return samples_; }
  std::optional<uint64_t> committed() const { return committed_; }
  // kCompleted: from the last step line to the commit; kKilled: from the kill to the
  // end of the survivors; kStopped: from the decision to stop to the workers' end.
  double stop_seconds() const { return stop_seconds_; }
  Clock::time_point kill_time() const { return t_kill_; }
  // Where stop_seconds() begins: the last step line, the kill or the decision to stop.
  Clock::time_point stop_begin() const { return t_stop_begin_; }
  // Whether the scheduled kill struck, the ranks it killed and the hosts it lost.
  bool kill_struck() const { return killed_; }
  const std::vector<int>& killed_ranks() const { return to_kill_; }
  const std::vector<std::string>& lost_hosts() const { return lost_hosts_; }

 private:
  struct Worker {
    pid_t pid = -1;
    int rank = 0;
    std::string log;
    bool exited = false;
    int status = 0;
    WarmWorker warm;      // with a pool
    bool parked = false;  // alive, waiting in the pool's protocol for its next segment
  };

  Status Open();
  Status OpenTarget();
  Status WriteHandoff(const std::string& path, const nlohmann::json& h);
  Status Launch();
  Status TransformIn();
  void StateReady();
  Status Watch();
  Status ReadLog();
  Status CommitIfWritten();
  Status StartWorker(int rank, WorkerArgs& args);
  void ParkIfDone();
  // Warm: tells the running workers to park (`planned`: a stop of a healthy world).
  void AbortSurvivors(bool planned = false);
  void ParkSurvivors();
  void WarnNotParked() const;
  void HandToPool();
  Status KillIfDue();
  void Reap();
  Status Finish();
  // Stops the workers, drops the open version, enters kFailed and returns s.
  Status Fail(Status s);
  void KillWorkers();
  // Warm: stops the workers that did not park in time after the abort (the parked ones
  // stay for the next segment, which starts the others cold).
  void KillUnparked();
  void StopWorkers();
  std::string KeepLog(const std::string& log) const;

  SegmentEnv env_;
  SegmentSpec spec_;
  SegmentFiles files_;
  State state_ = State::kOpening;
  std::vector<Target> targets_;
  std::size_t target_ = 0;
  std::optional<uint64_t> open_;
  std::optional<uint64_t> committed_;
  int64_t step_, samples_;
  std::vector<Worker> workers_;
  std::size_t alive_ = 0;
  std::optional<LogTail> tail_;
  std::vector<int> to_kill_;
  std::vector<std::string> lost_hosts_;
  bool kill_scheduled_ = false, killed_ = false, failed_ = false, stopped_ = false;
  bool state_ready_ = false;  // on_state was called
  bool aborting_ = false;     // warm: the kill's survivors (or all, at a stop) were told to park
  bool unparked_killed_ = false;  // warm: those that did not park in time were stopped
  std::string failure_;
  int64_t last_step_seen_;
  double step_interval_ = 0.4;  // between the last two step lines (a guess until two are seen)
  Clock::time_point t_launch_, t_progress_, t_last_step_, t_kill_, t_stop_begin_;
  std::optional<Clock::time_point> kill_at_;
  double stop_seconds_ = 0;
};

}  // namespace tenplex::runtime
