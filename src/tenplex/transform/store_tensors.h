// A job's tensors in one store, as the transforms use them: the version's state, the
// old ranks' committed tensors mapped as sources, the new ranks' tensors allocated as
// destinations, and unchanged tensors linked from the old version into the new one.
// Shared by the single-store transform (local.h) and the transform agent of a daemon
// (agent.h), which runs its host's part of a distributed transform.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tenplex/io/state_info.h"
#include "tenplex/plan/planner.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/store/store.h"
#include "tenplex/util/status.h"

namespace tenplex::transform {

// A version of a job and its info (model, config and the other fields).
struct VersionState {
  uint64_t version = 0;
  StateInfo info;
};

// Reads a version of a job (nullopt: current); FailedPrecondition naming the version
// when its info has no valid model and config.
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
// `prefault`: the tensors (rank, index) whose page tables are filled now, as the copies
// will read them (null: all); the others are mapped only.
Result<MappedSources> MapSources(const store::Store& store, const std::string& job,
                                 uint64_t version, const Layout& layout,
                                 const std::vector<int>* hosts, int host,
                                 const std::set<std::pair<int, int>>* prefault = nullptr);
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
// Which tensors LinkUnchanged links, from the layouts and the plan alone (no store).
std::set<std::pair<int, int>> UnchangedTensors(const Layout& from, const Layout& to,
                                               const plan::Plan& plan,
                                               const std::vector<int>* from_hosts,
                                               const std::vector<int>* to_hosts, int host);

// The sizes of the files a transform allocates on this host (every new tensor of its
// ranks but the unchanged ones), for pre-sizing its page pool (Store::FillPool).
std::vector<uint64_t> NewTensorBytes(const Layout& to, const std::vector<int>* to_hosts, int host,
                                     const std::set<std::pair<int, int>>& unchanged);

Result<std::set<std::pair<int, int>>> LinkUnchanged(
    store::Store& store, const std::string& job, uint64_t from_version, uint64_t to_version,
    const Layout& from, const Layout& to, const plan::Plan& plan,
    const std::vector<int>* from_hosts, const std::vector<int>* to_hosts, int host, int64_t* bytes);

}  // namespace tenplex::transform
