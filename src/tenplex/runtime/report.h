// What a run reports: the runner's events in the run log (JSON lines, beside the
// workers' step lines), the summary a caller gets back, and its table.
//
// A reconfiguration's record waits until the new workers have completed their first
// step (its restart time ends there); after a failure the record also waits until
// the failed step is done again (the recovery time).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tenplex/runtime/process.h"
#include "tenplex/runtime/runner.h"
#include "tenplex/util/status.h"

namespace tenplex::runtime {

// Creates the JSON-lines file `path` unless it exists (an existing one is kept).
Status CreateLog(const std::string& path);
// Appends one line (j and a newline, one write(2)) to the JSON-lines file `path`.
Status AppendLogLine(const std::string& path, const nlohmann::json& j);

// Builds RunSummary::reconfigurations and logs the runner's events. Not thread-safe.
class RunRecorder {
 public:
  RunRecorder(std::string log_path, RunSummary* summary)
      : log_(std::move(log_path)), summary_(summary) {}

  // A reconfiguration (or the restart after a failure) whose new workers have not
  // completed a step yet; it began at `t_begin` (the old config's last step, or the kill).
  void SetPending(const ReconfigureRecord& rec, Clock::time_point t_begin);
  // A worker logged step `step`; the workers were started at `t_launch` from
  // `start_step` or later. Logs the pending reconfiguration ({"event": "reconfigure"})
  // and, once the failed step is done again, {"event": "recovered"}.
  Status OnStep(int64_t step, int64_t start_step, Clock::time_point t_launch);
  // Logs {"event": "failure", ...}.
  Status Failure(const nlohmann::json& event);
  // At the end of the run: a pending record goes into the summary as it is.
  void Finish();

 private:
  std::string log_;
  RunSummary* summary_;
  std::optional<ReconfigureRecord> pending_;
  std::ptrdiff_t recovering_ = -1;  // index of a failure's record until its step is re-done
  Clock::time_point t_begin_, t_failure_;
};

// Fills summary.max_loss_deviation and sample_mismatches against a static run's log.
Status CompareWithBaseline(RunSummary& summary, const std::string& baseline_log);

}  // namespace tenplex::runtime
