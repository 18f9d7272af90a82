#include "tenplex/transform/local.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "tenplex/transform/host_exec.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/store/parse.h"

namespace tenplex::transform {

using nlohmann::json;

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<VersionState> ParseVersionState(const std::string& job, uint64_t version, const std::string& info) {
  json j = json::parse(info, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("model") || !j.contains("config") ||
      !j["config"].is_string()) {
    return FailedPrecondition("version " + std::to_string(version) + " of job '" + job +
                              "' has no model and config in its info");
  }
  VersionState s;
  s.version = version;
  s.info = info;
  TP_ASSIGN_OR_RETURN(s.model, ModelFromJson(j["model"].dump()));
  TP_ASSIGN_OR_RETURN(s.config, ParseConfig(j["config"].get<std::string>()));
  return s;
}

Result<VersionState> ReadVersionState(const store::Store& store, const std::string& job,
                                      store::VersionRef version) {
  TP_ASSIGN_OR_RETURN(store::VersionInfo vi, store.Version(job, version));
  return ParseVersionState(job, vi.version, vi.info);
}

std::string TensorPathOf(const std::string& job, uint64_t version, int rank, const std::string& name) {
  return "jobs/" + job + "/" + std::to_string(version) + "/" + store::RankSegment(rank) + "/" + name;
}

Result<MappedSources> MapSources(const store::Store& store, const std::string& job, uint64_t version,
                                 const Layout& layout, const std::vector<int>* hosts, int host) {
  MappedSources m;
  m.refs.resize(layout.world_size());
  m.ptrs.resize(layout.world_size());
  for (const RankLayout& r : layout.ranks) {
    if (hosts != nullptr && hosts->at(r.rank) != host) continue;
    for (const LocalTensor& t : *r.tensors) {
      auto ref = store.Get(TensorPathOf(job, version, r.rank, t.name));
      if (!ref.ok()) return ref.status().WithContext("job " + job + " rank " + std::to_string(r.rank));
      if (ref->info().dtype != t.dtype || ref->info().shape != t.shape) {
        return DataLoss("job " + job + " version " + std::to_string(version) + " rank " + std::to_string(r.rank) +
                        " tensor " + t.name + " is " + std::string(DTypeName(ref->info().dtype)) + " [" +
                        ShapeToString(ref->info().shape) + "] but config " + layout.config.ToString() + " needs " +
                        std::string(DTypeName(t.dtype)) + " [" + ShapeToString(t.shape) + "]");
      }
      m.ptrs[r.rank].push_back(ref->data());
      m.refs[r.rank].push_back(std::move(ref).value());
    }
  }
  std::vector<const store::TensorRef*> all;
  for (const auto& rank : m.refs) {
    for (const store::TensorRef& ref : rank) all.push_back(&ref);
  }
  ThreadPool::Default().ParallelFor(all.size(), [&](std::size_t i) { all[i]->Prefault(); });
  return m;
}

Result<std::set<std::pair<int, int>>> LinkUnchanged(store::Store& store, const std::string& job,
                                                    uint64_t from_version, uint64_t to_version, const Layout& from,
                                                    const Layout& to, const plan::Plan& plan,
                                                    const std::vector<int>* from_hosts,
                                                    const std::vector<int>* to_hosts, int host, int64_t* bytes) {
  std::set<std::pair<int, int>> written;  // destinations of ops: never linked
  for (const plan::CopyOp& op : plan.ops) written.insert({op.dst_rank, op.dst_tensor});
  std::set<std::pair<int, int>> linked;
  for (const RankLayout& r : to.ranks) {
    if (r.rank >= from.world_size()) continue;
    if (to_hosts != nullptr && to_hosts->at(r.rank) != host) continue;
    if (from_hosts != nullptr && from_hosts->at(r.rank) != host) continue;
    const std::vector<LocalTensor>& old = *from.ranks[r.rank].tensors;
    for (std::size_t i = 0; i < r.tensors->size(); ++i) {
      const LocalTensor& t = (*r.tensors)[i];
      if (written.count({r.rank, static_cast<int>(i)})) continue;
      auto same = std::find_if(old.begin(), old.end(), [&](const LocalTensor& o) {
        if (o.name != t.name || o.dtype != t.dtype || o.shape != t.shape || o.pieces.size() != t.pieces.size()) {
          return false;
        }
        for (std::size_t k = 0; k < o.pieces.size(); ++k) {
          if (o.pieces[k].tensor != t.pieces[k].tensor || o.pieces[k].global != t.pieces[k].global ||
              o.pieces[k].local != t.pieces[k].local) {
            return false;
          }
        }
        return true;
      });
      if (same == old.end()) continue;
      TP_RETURN_IF_ERROR(store.Link(TensorPathOf(job, from_version, r.rank, t.name),
                                    TensorPathOf(job, to_version, r.rank, t.name))
                             .status());
      linked.insert({r.rank, static_cast<int>(i)});
      *bytes += t.bytes();
    }
  }
  return linked;
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
      TP_ASSIGN_OR_RETURN(store::TensorWriter w, store.Allocate(TensorPathOf(job, version, r.rank, t.name), t.dtype, t.shape));
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

Result<LocalTransformStats> TransformLocal(store::Store& store, const std::string& job,
                                           const ParallelConfig& to, bool keep_old) {
  LocalTransformStats stats;
  auto t0 = std::chrono::steady_clock::now();
  TP_ASSIGN_OR_RETURN(VersionState cur, ReadVersionState(store, job));
  TP_ASSIGN_OR_RETURN(Layout from_layout, MakeLayout(cur.model, cur.config));
  TP_ASSIGN_OR_RETURN(Layout to_layout, MakeLayout(cur.model, to));
  std::vector<int> from_hosts(from_layout.world_size(), 0), to_hosts(to_layout.world_size(), 0);
  TP_ASSIGN_OR_RETURN(plan::Plan p, plan::MakePlan(cur.model, from_layout, to_layout, from_hosts, to_hosts));
  stats.plan = p.stats;
  stats.plan_seconds = Since(t0);

  auto t1 = std::chrono::steady_clock::now();
  TP_ASSIGN_OR_RETURN(MappedSources src, MapSources(store, job, cur.version, from_layout, nullptr, 0));
  json info = json::parse(cur.info);
  info["config"] = to.ToString();
  TP_ASSIGN_OR_RETURN(uint64_t v, store.BeginVersion(job, std::nullopt, info.dump()));
  stats.new_version = v;
  auto fail = [&](const Status& s) {
    (void)store.DropVersion(job, v);
    return s;
  };
  Result<std::set<std::pair<int, int>>> linked =
      LinkUnchanged(store, job, cur.version, v, from_layout, to_layout, p, nullptr, nullptr, 0, &stats.bytes_linked);
  if (!linked.ok()) return fail(linked.status());
  Result<MappedDests> dst = AllocateDests(store, job, v, to_layout, nullptr, 0, &*linked);
  if (!dst.ok()) return fail(dst.status());
  HostExecInput in;
  in.plan = &p;
  in.from = &from_layout;
  in.to = &to_layout;
  in.from_hosts = &from_hosts;
  in.to_hosts = &to_hosts;
  in.host = 0;
  in.src = &src.ptrs;
  in.dst = &dst->ptrs;
  in.pool = &ThreadPool::Default();
  in.linked = &*linked;
  Result<HostExecStats> ex = ExecuteHostPart(in);
  if (!ex.ok()) return fail(ex.status());
  stats.bytes_copied = ex->bytes_kept + ex->bytes_local;
  stats.execute_seconds = Since(t1);
  auto t2 = std::chrono::steady_clock::now();
  dst->writers.clear();
  Status st = store.Commit(job, v, keep_old);
  if (!st.ok()) return fail(st);
  stats.commit_seconds = Since(t2);
  return stats;
}

}  // namespace tenplex::transform
