#include "tenplex/transform/local.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "tenplex/plan/executor.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/store/parse.h"

namespace tenplex::transform {

using nlohmann::json;

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string TensorPathOf(const std::string& job, uint64_t version, int rank, const std::string& name) {
  return "jobs/" + job + "/" + std::to_string(version) + "/" + store::RankSegment(rank) + "/" + name;
}

}  // namespace

Result<VersionState> ReadVersionState(const store::Store& store, const std::string& job,
                                      store::VersionRef version) {
  TP_ASSIGN_OR_RETURN(store::VersionInfo vi, store.Version(job, version));
  json j = json::parse(vi.info, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("model") || !j.contains("config") ||
      !j["config"].is_string()) {
    return FailedPrecondition("version " + std::to_string(vi.version) + " of job " + job +
                              " has no model and config in its info");
  }
  VersionState s;
  s.version = vi.version;
  s.info = vi.info;
  TP_ASSIGN_OR_RETURN(s.model, ModelFromJson(j["model"].dump()));
  TP_ASSIGN_OR_RETURN(s.config, ParseConfig(j["config"].get<std::string>()));
  return s;
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
  // Sources: the committed tensors, mapped read-only.
  std::vector<std::vector<store::TensorRef>> refs(from_layout.world_size());
  std::vector<std::vector<const void*>> src(from_layout.world_size());
  for (const RankLayout& r : from_layout.ranks) {
    for (const LocalTensor& t : *r.tensors) {
      auto ref = store.Get(TensorPathOf(job, cur.version, r.rank, t.name));
      if (!ref.ok()) return ref.status().WithContext("job " + job + " rank " + std::to_string(r.rank));
      if (ref->info().dtype != t.dtype || ref->info().shape != t.shape) {
        return DataLoss("job " + job + " rank " + std::to_string(r.rank) + " tensor " + t.name + " is " +
                        std::string(DTypeName(ref->info().dtype)) + " [" + ShapeToString(ref->info().shape) +
                        "] but config " + cur.config.ToString() + " needs [" + ShapeToString(t.shape) + "]");
      }
      src[r.rank].push_back(ref->data());
      refs[r.rank].push_back(std::move(ref).value());
    }
  }
  json info = json::parse(cur.info);
  info["config"] = to.ToString();
  TP_ASSIGN_OR_RETURN(uint64_t v, store.BeginVersion(job, std::nullopt, info.dump()));
  stats.new_version = v;
  auto fail = [&](const Status& s) {
    (void)store.DropVersion(job, v);
    return s;
  };
  std::vector<std::vector<store::TensorWriter>> writers(to_layout.world_size());
  std::vector<std::vector<void*>> dst(to_layout.world_size());
  for (const RankLayout& r : to_layout.ranks) {
    for (const LocalTensor& t : *r.tensors) {
      auto w = store.Allocate(TensorPathOf(job, v, r.rank, t.name), t.dtype, t.shape);
      if (!w.ok()) return fail(w.status());
      dst[r.rank].push_back(w->data());
      writers[r.rank].push_back(std::move(w).value());
    }
  }
  plan::ExecuteOptions opts;
  opts.pool = &ThreadPool::Default();
  opts.zero_padding = false;  // fresh store tensors are zero-filled
  Status st = plan::ExecutePlan(p, from_layout, to_layout, src, dst, opts);
  if (!st.ok()) return fail(st);
  for (const plan::CopyOp& op : p.ops) {
    stats.bytes_copied += Volume(op.global) * static_cast<int64_t>(DTypeSize(from_layout.globals.at(p.tensors[op.tensor]).dtype));
  }
  for (const plan::CopyOp& op : p.kept) {
    stats.bytes_copied += Volume(op.global) * static_cast<int64_t>(DTypeSize(from_layout.globals.at(p.tensors[op.tensor]).dtype));
  }
  stats.execute_seconds = Since(t1);
  auto t2 = std::chrono::steady_clock::now();
  writers.clear();
  st = store.Commit(job, v, keep_old);
  if (!st.ok()) return fail(st);
  stats.commit_seconds = Since(t2);
  return stats;
}

}  // namespace tenplex::transform
