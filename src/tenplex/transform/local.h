// Transforming a job's state inside one store: the committed version of a job, laid
// out for one parallel config, becomes a new committed version laid out for another.
// The single-host case of the distributed transformer: every old and new rank is on
// this host, so the plan has no cross-host ops and every op is a strided copy between
// two shared-memory tensors of the store. The old version is untouched until the new
// one is committed (and then released), so a failure leaves the job as it was.
//
// A version's info (store VersionInfo::info) is a JSON object with at least
// {"model": <model JSON>, "config": "<config>"}; other fields (step,
// samples_consumed, ...) are carried over to the new version.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include "tenplex/model/model.h"
#include "tenplex/plan/planner.h"
#include "tenplex/ptc/config.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/store/store.h"
#include "tenplex/util/status.h"

namespace tenplex::transform {

struct VersionState {
  uint64_t version = 0;
  Model model;
  ParallelConfig config;
  std::string info;  // the whole info JSON
};

// The model and config of a version from its info JSON (FailedPrecondition naming the
// version when they are missing or malformed).
Result<VersionState> ParseVersionState(const std::string& job, uint64_t version, const std::string& info);

// Reads the model and config of a version of a job (nullopt: current).
Result<VersionState> ReadVersionState(const store::Store& store, const std::string& job,
                                      store::VersionRef version = {});

// The tensors of one version of a job that live on one host, mapped: the old ranks'
// committed tensors read-only (sources of a transform) or the new ranks' tensors of an
// open version writable (destinations). Indexed [rank][local tensor]; ranks of other
// hosts are empty.
struct MappedSources {
  std::vector<std::vector<store::TensorRef>> refs;
  std::vector<std::vector<const void*>> ptrs;
};
struct MappedDests {
  std::vector<std::vector<store::TensorWriter>> writers;
  std::vector<std::vector<void*>> ptrs;
};
// hosts[r] == host selects the ranks (hosts may be null: every rank). Checks every
// tensor's dtype and shape against the layout (DataLoss naming it otherwise).
Result<MappedSources> MapSources(const store::Store& store, const std::string& job, uint64_t version,
                                 const Layout& layout, const std::vector<int>* hosts, int host);
// `skip`: tensors (rank, index) not to allocate (linked ones); their pointer is null.
Result<MappedDests> AllocateDests(store::Store& store, const std::string& job, uint64_t version,
                                  const Layout& layout, const std::vector<int>* hosts, int host,
                                  const std::set<std::pair<int, int>>* skip = nullptr);

// The new ranks' tensors on this host that equal, element for element, a tensor of the
// same old rank on this host (the same device): same name, dtype, shape and pieces
// (so the same global elements at the same offsets, padding zero in both), and no op
// writes them. They are linked into the new version (Store::Link: the same pages, no
// allocation, no copy) instead of allocated and copied; returns them as (rank,
// tensor index) and adds their bytes to *bytes. hosts null: every rank on this host.
Result<std::set<std::pair<int, int>>> LinkUnchanged(store::Store& store, const std::string& job,
                                                    uint64_t from_version, uint64_t to_version, const Layout& from,
                                                    const Layout& to, const plan::Plan& plan,
                                                    const std::vector<int>* from_hosts,
                                                    const std::vector<int>* to_hosts, int host, int64_t* bytes);
// jobs/<job>/<version>/rank-NNNNN/<name>
std::string TensorPathOf(const std::string& job, uint64_t version, int rank, const std::string& name);

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
