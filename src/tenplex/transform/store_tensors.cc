#include "tenplex/transform/store_tensors.h"

#include <algorithm>

#include "tenplex/store/parse.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::transform {

Result<VersionState> ReadVersionState(const store::Store& store, const std::string& job,
                                      store::VersionRef version) {
  TP_ASSIGN_OR_RETURN(store::VersionInfo vi, store.Version(job, version));
  TP_ASSIGN_OR_RETURN(StateInfo info, ParseStateInfo(job, vi.version, vi.info));
  return VersionState{vi.version, std::move(info)};
}

Result<MappedSources> MapSources(const store::Store& store, const std::string& job,
                                 uint64_t version, const Layout& layout,
                                 const std::vector<int>* hosts, int host,
                                 const std::set<std::pair<int, int>>* prefault) {
  MappedSources m;
  m.refs.resize(layout.world_size());
  m.ptrs.resize(layout.world_size());
  for (const RankLayout& r : layout.ranks) {
    if (hosts != nullptr && hosts->at(r.rank) != host) continue;
    for (const LocalTensor& t : *r.tensors) {
      auto ref = store.Get(store::TensorPathOf(job, version, r.rank, t.name));
      if (!ref.ok())
        return ref.status().WithContext("job " + job + " rank " + std::to_string(r.rank));
      if (ref->info().dtype != t.dtype || ref->info().shape != t.shape) {
        return DataLoss("job " + job + " version " + std::to_string(version) + " rank " +
                        std::to_string(r.rank) + " tensor " + t.name + " is " +
                        std::string(DTypeName(ref->info().dtype)) + " [" +
                        ShapeToString(ref->info().shape) + "] but config " +
                        layout.config.ToString() + " needs " + std::string(DTypeName(t.dtype)) +
                        " [" + ShapeToString(t.shape) + "]");
      }
      m.ptrs[r.rank].push_back(ref->data());
      m.refs[r.rank].push_back(std::move(ref).value());
    }
  }
  std::vector<const store::TensorRef*> all;
  for (std::size_t r = 0; r < m.refs.size(); ++r) {
    for (std::size_t t = 0; t < m.refs[r].size(); ++t) {
      if (prefault == nullptr || prefault->count({static_cast<int>(r), static_cast<int>(t)}))
        all.push_back(&m.refs[r][t]);
    }
  }
  ThreadPool::Default().ParallelFor(all.size(), [&](std::size_t i) { all[i]->Prefault(); });
  return m;
}

std::set<std::pair<int, int>> UnchangedTensors(const Layout& from, const Layout& to,
                                               const plan::Plan& plan,
                                               const std::vector<int>* from_hosts,
                                               const std::vector<int>* to_hosts, int host) {
  std::set<std::pair<int, int>> written;  // destinations of ops: never linked
  for (const plan::CopyOp& op : plan.ops) written.insert({op.dst_rank, op.dst_tensor});
  std::set<std::pair<int, int>> same;
  for (const RankLayout& r : to.ranks) {
    if (r.rank >= from.world_size()) continue;
    if (to_hosts != nullptr && to_hosts->at(r.rank) != host) continue;
    if (from_hosts != nullptr && from_hosts->at(r.rank) != host) continue;
    const std::vector<LocalTensor>& old = *from.ranks[r.rank].tensors;
    for (std::size_t i = 0; i < r.tensors->size(); ++i) {
      const LocalTensor& t = (*r.tensors)[i];
      if (written.count({r.rank, static_cast<int>(i)})) continue;
      auto it = std::find_if(old.begin(), old.end(), [&](const LocalTensor& o) {
        if (o.name != t.name || o.dtype != t.dtype || o.shape != t.shape ||
            o.pieces.size() != t.pieces.size()) {
          return false;
        }
        for (std::size_t k = 0; k < o.pieces.size(); ++k) {
          if (o.pieces[k].tensor != t.pieces[k].tensor ||
              o.pieces[k].global != t.pieces[k].global || o.pieces[k].local != t.pieces[k].local) {
            return false;
          }
        }
        return true;
      });
      if (it != old.end()) same.insert({r.rank, static_cast<int>(i)});
    }
  }
  return same;
}

std::vector<uint64_t> NewTensorBytes(const Layout& to, const std::vector<int>* to_hosts, int host,
                                     const std::set<std::pair<int, int>>& unchanged) {
  std::vector<uint64_t> sizes;
  for (const RankLayout& r : to.ranks) {
    if (to_hosts != nullptr && to_hosts->at(r.rank) != host) continue;
    for (std::size_t i = 0; i < r.tensors->size(); ++i) {
      if (!unchanged.count({r.rank, static_cast<int>(i)}))
        sizes.push_back(static_cast<uint64_t>((*r.tensors)[i].bytes()));
    }
  }
  return sizes;
}

Result<std::set<std::pair<int, int>>> LinkUnchanged(store::Store& store, const std::string& job,
                                                    uint64_t from_version, uint64_t to_version,
                                                    const Layout& from, const Layout& to,
                                                    const plan::Plan& plan,
                                                    const std::vector<int>* from_hosts,
                                                    const std::vector<int>* to_hosts, int host,
                                                    int64_t* bytes) {
  const std::set<std::pair<int, int>> same =
      UnchangedTensors(from, to, plan, from_hosts, to_hosts, host);
  for (const auto& [rank, i] : same) {
    const LocalTensor& t = (*to.ranks[rank].tensors)[i];
    TP_RETURN_IF_ERROR(store
                           .Link(store::TensorPathOf(job, from_version, rank, t.name),
                                 store::TensorPathOf(job, to_version, rank, t.name))
                           .status());
    *bytes += t.bytes();
  }
  return same;
}

Result<MappedDests> AllocateDests(store::Store& store, const std::string& job, uint64_t version,
                                  const Layout& layout, const std::vector<int>* hosts, int host,
                                  const std::set<std::pair<int, int>>* skip) {
  MappedDests m;
  m.writers.resize(layout.world_size());
  m.ptrs.resize(layout.world_size());
  for (const RankLayout& r : layout.ranks) {
    if (hosts != nullptr && hosts->at(r.rank) != host) continue;
    for (const LocalTensor& t : *r.tensors) {
      if (skip != nullptr && skip->count({r.rank, static_cast<int>(m.ptrs[r.rank].size())})) {
        m.ptrs[r.rank].push_back(nullptr);
        m.writers[r.rank].emplace_back();
        continue;
      }
      TP_ASSIGN_OR_RETURN(
          store::TensorWriter w,
          store.Allocate(store::TensorPathOf(job, version, r.rank, t.name), t.dtype, t.shape));
      m.ptrs[r.rank].push_back(w.data());
      m.writers[r.rank].push_back(std::move(w));
    }
  }
  std::vector<const store::TensorWriter*> all;
  for (const auto& rank : m.writers) {
    for (const store::TensorWriter& w : rank) all.push_back(&w);
  }
  ThreadPool::Default().ParallelFor(all.size(), [&](std::size_t i) { all[i]->Prefault(); });
  return m;
}

}  // namespace tenplex::transform
