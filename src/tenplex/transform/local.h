// Transforming a job's state inside one store: the committed version of a job, laid
// out for one parallel config, becomes a new committed version laid out for another.
// The single-host case of the distributed transformer: every old and new rank is on
// this host, so the plan has no cross-host ops and every op is a strided copy between
// two shared-memory tensors of the store. The old version is untouched until the new
// one is committed (and then released), so a failure leaves the job as it was.
//
// The version's info (state_info.h) is carried over to the new version with the new
// config. The helpers it shares with the transform agent: store_tensors.h.
#pragma once

#include <cstdint>

#include "tenplex/plan/planner.h"
#include "tenplex/ptc/config.h"
#include "tenplex/store/store.h"
#include "tenplex/transform/store_tensors.h"
#include "tenplex/util/status.h"

namespace tenplex::transform {

struct LocalTransformStats {
  uint64_t new_version = 0;
  plan::PlanStats plan;
  int64_t bytes_copied = 0;  // bytes written by copies (ops and kept regions)
  int64_t bytes_linked = 0;  // unchanged tensors shared with the old version, not copied
  double plan_seconds = 0;
  double execute_seconds = 0;
  double commit_seconds = 0;
};

// Transforms the current version of `job` to `to`, commits the result and releases
// the old version (unless keep_old). Extra info fields are carried over.
Result<LocalTransformStats> TransformLocal(store::Store& store, const std::string& job,
                                           const ParallelConfig& to, bool keep_old = false);

}  // namespace tenplex::transform
