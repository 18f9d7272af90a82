// Processes of the runtime: the seam between the runner and the operating system.
//
// The runner starts workers, watches them exit and kills them through a
// ProcessLauncher (a small abstract interface in the style of leveldb's Env):
// NewProcessLauncher() returns the real one (fork/exec, process groups, waitpid);
// tests wrap it to record every command line or to make a start fail, and run
// /bin/sh scripts as workers, so the runner's commit/kill/recovery state machine is
// tested in seconds without torch.
//
// Also here: a free TCP port for the workers' rendezvous, the SIGINT/SIGTERM guard of
// a run, following a growing log file, and the tail of a worker's output.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tenplex/util/status.h"

namespace tenplex::runtime {

using Clock = std::chrono::steady_clock;

// Seconds from `t` to now.
double Since(Clock::time_point t);

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  // Starts argv (argv[0] looked up in PATH) in a process group of its own, with its
  // stdout and stderr written to `log` (truncated). A command that cannot be executed
  // still starts: it exits with code 127 after writing why into `log`.
  // REQUIRES: argv is not empty.
  virtual Result<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log) = 0;
  // SIGKILL to the process group of a started, not yet reaped process.
  virtual void Kill(pid_t pid) = 0;
  // The wait status (waitpid) once the process has exited, reaping it; nullopt while
  // it runs. REQUIRES: pid was started here and not reaped yet.
  virtual std::optional<int> TryWait(pid_t pid) = 0;
  // Blocks until the process exits, reaping it; its wait status.
  virtual int Wait(pid_t pid) = 0;
};

// The real launcher: fork, setpgid, execvp. Thread-safe (it keeps no state).
std::unique_ptr<ProcessLauncher> NewProcessLauncher();

// "exited with code N" or "was killed by signal N" for a wait status.
std::string DescribeExit(int wait_status);
bool ExitedOk(int wait_status);

// A TCP port that was free a moment ago on every interface, below the kernel's ephemeral
// range where it can (an outgoing connection cannot take it before the workers bind it).
Result<int> FreePort();

// While alive, SIGINT and SIGTERM set a flag instead of ending the process (workers
// run in their own process groups, so a terminal's Ctrl-C reaches only the runner):
// the runner polls InterruptSignal(), stops its workers and returns. The previous
// handlers come back at destruction. One guard at a time per process.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};
// The signal received under the current guard, 0 when none.
int InterruptSignal();

// Follows a growing JSON-lines file from its size at construction: Poll() returns
// the complete lines that are JSON objects and were appended since the last call.
class LogTail {
 public:
  explicit LogTail(std::string path);
  std::vector<nlohmann::json> Poll();

 private:
  std::string path_;
  off_t offset_ = 0;
  std::string partial_;
};

// The last `bytes` of a file ("" when it cannot be read).
std::string FileTail(const std::string& path, std::size_t bytes = 2000);

}  // namespace tenplex::runtime
