#include "tenplex/runtime/runner.h"

#include "tenplex/runtime/backend.h"
#include "tenplex/runtime/process.h"
#include "tenplex/runtime/schedule_loop.h"

namespace tenplex::runtime {

Result<RunSummary> Run(const RunOptions& o) {
  TP_ASSIGN_OR_RETURN(RunInputs in, LoadRunInputs(o));
  std::unique_ptr<StateBackend> st;
  if (o.cluster_path.empty()) {
    TP_ASSIGN_OR_RETURN(st, OpenEmbeddedBackend(o));
  } else {
    if (!o.shm_dir.empty())
      return InvalidArgument("give --shm-dir (embedded store) or --cluster, not both");
    TP_ASSIGN_OR_RETURN(st, OpenClusterBackend(o));
  }
  std::unique_ptr<ProcessLauncher> launcher = NewProcessLauncher();
  return RunSchedule(o, in, *st, *launcher);
}

}  // namespace tenplex::runtime
