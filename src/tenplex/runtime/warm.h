// Warm workers (`tenplex run --warm`): worker processes that live through many
// segments instead of one, so that a reconfiguration costs a new process group and
// the re-mapping of the state, not new Python processes (the worker's side is
// python/tenplex/warm.py).
//
// The protocol, per worker (files in the run's work directory, written atomically):
//   the runner starts a worker with --warm-control P (P = <work>/warm-w<id>-);
//   after each segment the worker destroys its process group, writes P<n>.parked and
//   waits for P<n>.json, n = 1, 2, ...: {"args": [...]} are the runner's arguments of
//   its next segment (handoff.h's WorkerArgv without the command), {"exit": true}
//   ends it (exit 0);
//   while a segment runs, P<n>.abort (a peer failed) makes the worker break its
//   connections, drop its process group and park (P<n>.parked) like after a normal
//   segment.
// At a reconfiguration the runner gives the next world's ranks 0, 1, ... to the
// parked workers in the order of their old ranks and starts new workers only for the
// ranks left (cold); parked workers without a rank are told to exit.
//
// WarmPool holds the parked workers between segments. Not thread-safe (the runner's
// thread).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/runtime/process.h"
#include "tenplex/util/status.h"

namespace tenplex::runtime {

// Writes data to a temporary file beside path and renames it onto path, without
// WriteFileAtomic's fsyncs: readers see no file or the whole one, but a machine crash
// may lose it. For the messages between the runner and live warm workers, where two
// fsyncs on a busy disk cost more than the message is worth.
Status PublishFile(const std::string& path, std::string_view data);

struct WarmWorker {
  pid_t pid = -1;
  int id = 0;
  int seq = 0;         // messages received so far; the next is seq + 1
  std::string prefix;  // P of --warm-control
  std::string log;     // its stdout and stderr (of the segment that started it)
  // The file of message seq + 1 with extension ext ("json", "abort", "parked").
  std::string Path(const char* ext) const;
};

class WarmPool {
 public:
  WarmPool(ProcessLauncher* launcher, std::string work_dir)
      : launcher_(launcher), work_(std::move(work_dir)) {}
  ~WarmPool();  // kills and reaps the workers still held
  WarmPool(const WarmPool&) = delete;
  WarmPool& operator=(const WarmPool&) = delete;

  // A new worker's identity (its --warm-control is w.prefix()); pid and log are the
  // caller's to fill.
  WarmWorker NewWorker();
  // Workers that finished a segment, in the order of their ranks there.
  void Park(std::vector<WarmWorker> workers);
  // The first parked worker that still runs (one that exited meanwhile is reaped and
  // skipped), or none.
  std::optional<WarmWorker> Take();
  // Sends w its next segment's arguments (message seq + 1) and advances w.seq.
  Status Send(WarmWorker& w, const std::vector<std::string>& args);
  // Tells the running worker w to stop its segment: a peer failed (it breaks off the step
  // in progress), or with `planned` the runner stops a healthy world (a rebalance): the
  // ranks agree on a step boundary and park there, their connections intact.
  Status Abort(const WarmWorker& w, bool planned = false);
  // Whether w wrote the .parked file of its current message.
  static bool IsParked(const WarmWorker& w);
  // Starts workers ahead until `n` spares wait (none when n <= 0): CMD --warm-control P
  // --warm-spare, which park at once (P1.parked) and take their first segment's
  // arguments like any parked worker; their output goes to <log_dir>/worker-spare<id>.log.
  // Take() hands out parked workers first, then spares.
  Status StartSpares(int n, const std::vector<std::string>& command, const std::string& log_dir);
  std::size_t spares() const { return spares_.size(); }
  // Tells every parked worker (with `wait` also every spare) to exit; with `wait` reaps them (and
  // the ones told before), else reaps those that have exited and keeps the others for later.
  void Release(bool wait);
  // Reaps the workers told to exit that have exited.
  void ReapLeaving();
  std::size_t parked() const { return parked_.size(); }

 private:
  ProcessLauncher* launcher_;
  std::string work_;
  int next_id_ = 0;
  std::vector<WarmWorker> parked_;
  std::vector<WarmWorker> spares_;
  std::vector<pid_t> leaving_;  // told to exit, not reaped yet
};

}  // namespace tenplex::runtime
