#include "tenplex/transform/local.h"

#include <chrono>

#include "tenplex/ptc/layout.h"
#include "tenplex/transform/host_exec.h"

namespace tenplex::transform {

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<LocalTransformStats> TransformLocal(store::Store& store, const std::string& job,
                                           const ParallelConfig& to, bool keep_old) {
  LocalTransformStats stats;
  auto t0 = std::chrono::steady_clock::now();
  TP_ASSIGN_OR_RETURN(VersionState cur, ReadVersionState(store, job));
  const Model& model = cur.info.model();
  TP_ASSIGN_OR_RETURN(Layout from_layout, MakeLayout(model, cur.info.config()));
  TP_ASSIGN_OR_RETURN(Layout to_layout, MakeLayout(model, to));
  std::vector<int> from_hosts(from_layout.world_size(), 0), to_hosts(to_layout.world_size(), 0);
  TP_ASSIGN_OR_RETURN(plan::Plan p,
                      plan::MakePlan(model, from_layout, to_layout, from_hosts, to_hosts));
  stats.plan = p.stats;
  stats.plan_seconds = Since(t0);

  auto t1 = std::chrono::steady_clock::now();
  TP_ASSIGN_OR_RETURN(MappedSources src,
                      MapSources(store, job, cur.version, from_layout, nullptr, 0));
  StateInfo info = cur.info;
  info.set_config(to);
  TP_ASSIGN_OR_RETURN(uint64_t v, store.BeginVersion(job, std::nullopt, info.ToJson()));
  stats.new_version = v;
  auto fail = [&](const Status& s) {
    (void)store.DropVersion(job, v);
    return s;
  };
  Result<std::set<std::pair<int, int>>> linked =
      LinkUnchanged(store, job, cur.version, v, from_layout, to_layout, p, nullptr, nullptr, 0,
                    &stats.bytes_linked);
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
