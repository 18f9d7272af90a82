// The schedule loop behind runtime::Run: drives segments (segment.h) through a
// schedule (schedule.h), transforming the committed state between configs.
//
// Entry i runs its config from its step to the next entry's step as one segment.
// After a completed segment whose successor has another config, the committed
// version is transformed into it (StateBackend::Transform) and the next segment
// starts from there. After a scheduled kill the job goes on from the last commit in
// the next entry's config (the same one when the kill struck in the last segment),
// re-running the steps since that commit; a kill entry fires once. Every
// reconfiguration becomes a record of the summary (report.h).
//
// This is the seam the unit tests use: they run it with a fake backend and a
// launcher that starts /bin/sh workers.
#pragma once

#include <vector>

#include "tenplex/model/model.h"
#include "tenplex/runtime/backend.h"
#include "tenplex/runtime/process.h"
#include "tenplex/runtime/runner.h"
#include "tenplex/runtime/schedule.h"

namespace tenplex::runtime {

struct RunInputs {
  Model model;
  std::vector<ScheduleEntry> schedule;
};

// The model (options.model_path, else --model of the worker command) and the checked
// schedule; InvalidArgument when the command or the model is missing.
Result<RunInputs> LoadRunInputs(const RunOptions& options);

// Runs the schedule with the state in `backend` and workers started by `launcher`.
// Installs an InterruptGuard for its duration.
Result<RunSummary> RunSchedule(const RunOptions& options, const RunInputs& inputs,
                               StateBackend& backend, ProcessLauncher& launcher);

}  // namespace tenplex::runtime
