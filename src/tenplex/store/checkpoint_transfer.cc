#include "tenplex/store/checkpoint_transfer.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "tenplex/io/checkpoint.h"
#include "tenplex/model/model.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/util/log.h"

namespace tenplex::store {

using nlohmann::json;

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The default order of a rank file: the layout's local tensors, then other names sorted.
std::vector<std::string> DefaultOrder(const RankLayout& rank, const std::set<std::string>& names) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const LocalTensor& t : *rank.tensors) {
    if (names.count(t.name)) {
      out.push_back(t.name);
      seen.insert(t.name);
    }
  }
  for (const std::string& n : names) {
    if (!seen.count(n)) out.push_back(n);
  }
  return out;
}

std::string RankPrefix(const std::string& job, uint64_t version, int rank) {
  return "jobs/" + job + "/" + std::to_string(version) + "/" + RankSegment(rank) + "/";
}

}  // namespace

Result<TransferStats> LoadCheckpoint(Client& client, const std::string& job, const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  TP_RETURN_IF_ERROR(CheckJobName(job));
  TP_ASSIGN_OR_RETURN(io::CheckpointInfo info, io::ReadCheckpointInfo(dir));
  TP_ASSIGN_OR_RETURN(Layout layout, MakeLayout(info.model, info.config));
  TP_ASSIGN_OR_RETURN(std::vector<io::SafetensorsFile> files,
                      io::OpenCheckpoint(dir, layout, info, /*verify_checksums=*/true));
  TransferStats stats;
  stats.ranks = layout.world_size();
  stats.shm = client.local();
  stats.verified = !info.checksums.empty();
  for (int r = 0; r < layout.world_size(); ++r) {
    if (info.checksums.count(io::RankFileName(r)) == 0) stats.verified = false;
  }

  json vinfo = {{"model", json::parse(ModelToJson(info.model))},
                {"config", info.config.ToString()},
                {"extra", info.extra},
                {"source", dir}};
  json st = json::object();
  for (int r = 0; r < layout.world_size(); ++r) {
    const io::SafetensorsFile& f = files[r];
    std::set<std::string> names;
    std::vector<std::string> order;
    for (const io::SafetensorsEntry& e : f.tensors()) {
      if (!IsValidSegment(e.name)) {
        return InvalidArgument(f.path() + ": tensor name '" + e.name +
                               "' cannot be a store path (A-Z a-z 0-9 . _ - only, at most 200 characters)");
      }
      names.insert(e.name);
      order.push_back(e.name);
    }
    json entry = json::object();
    if (!f.metadata().empty()) entry["metadata"] = f.metadata();
    if (order != DefaultOrder(layout.ranks[r], names)) entry["order"] = order;
    if (!entry.empty()) st[io::RankFileName(r)] = entry;
  }
  if (!st.empty()) vinfo["safetensors"] = st;

  TP_ASSIGN_OR_RETURN(uint64_t version, client.BeginVersion(job, std::nullopt, vinfo.dump()));
  stats.version = version;
  Status s;
  for (int r = 0; r < layout.world_size() && s.ok(); ++r) {
    std::vector<Store::AllocRequest> reqs;
    std::vector<const void*> data;
    for (const io::SafetensorsEntry& e : files[r].tensors()) {
      reqs.push_back({RankPrefix(job, version, r) + e.name, e.dtype, e.shape});
      data.push_back(files[r].data(e));
      stats.bytes += e.bytes();
      ++stats.tensors;
    }
    s = client.WriteMany(reqs, data);
    for (const io::SafetensorsEntry& e : files[r].tensors()) ReportProgress(e.bytes());
  }
  if (s.ok()) s = client.Commit(job, version);
  if (!s.ok()) {
    (void)client.Abort(job, version);  // best effort; the version was never committed
    return s.WithContext("loading " + dir + " into job " + job);
  }
  stats.seconds = Since(t0);
  return stats;
}

Result<TransferStats> SaveCheckpoint(Client& client, const std::string& job, const std::string& out) {
  const auto t0 = std::chrono::steady_clock::now();
  TP_RETURN_IF_ERROR(CheckJobName(job));
  TP_ASSIGN_OR_RETURN(VersionInfo vi, client.Version(job, std::nullopt));
  json info = json::parse(vi.info, nullptr, false);
  if (info.is_discarded() || !info.is_object() || !info.contains("model") || !info.contains("config") ||
      !info["config"].is_string()) {
    return FailedPrecondition("version " + std::to_string(vi.version) + " of job '" + job +
                              "' has no model and config in its info (it was not loaded from a checkpoint)");
  }
  TP_ASSIGN_OR_RETURN(Model model, ModelFromJson(info["model"].dump()));
  TP_ASSIGN_OR_RETURN(ParallelConfig config, ParseConfig(info["config"].get<std::string>()));
  TP_ASSIGN_OR_RETURN(Layout layout, MakeLayout(model, config));
  TP_ASSIGN_OR_RETURN(std::vector<TensorInfo> list,
                      client.List("jobs/" + job + "/" + std::to_string(vi.version) + "/"));
  std::map<int, std::map<std::string, TensorInfo>> by_rank;
  for (TensorInfo& t : list) {
    TP_ASSIGN_OR_RETURN(TensorPath p, ParseTensorPath(t.path));
    if (p.rank >= layout.world_size()) {
      return DataLoss(t.path + " belongs to rank " + std::to_string(p.rank) + " but config " + config.ToString() +
                      " has " + std::to_string(layout.world_size()) + " ranks");
    }
    by_rank[p.rank][p.name] = std::move(t);
  }
  TransferStats stats;
  stats.version = vi.version;
  stats.ranks = layout.world_size();
  stats.shm = client.local();
  TP_ASSIGN_OR_RETURN(io::CheckpointWriter writer, io::CheckpointWriter::Create(out));
  const json st = info.value("safetensors", json::object());
  for (int r = 0; r < layout.world_size(); ++r) {
    std::map<std::string, TensorInfo>& have = by_rank[r];
    for (const LocalTensor& t : *layout.ranks[r].tensors) {
      auto it = have.find(t.name);
      if (it == have.end()) {
        return DataLoss("version " + std::to_string(vi.version) + " of job '" + job + "' lacks tensor " + t.name +
                        " of rank " + std::to_string(r));
      }
      if (it->second.dtype != t.dtype || it->second.shape != t.shape) {
        return DataLoss(it->second.path + " is " + std::string(DTypeName(it->second.dtype)) + " [" +
                        ShapeToString(it->second.shape) + "] but the layout needs " +
                        std::string(DTypeName(t.dtype)) + " [" + ShapeToString(t.shape) + "]");
      }
    }
    std::set<std::string> names;
    for (const auto& [n, t] : have) names.insert(n);
    std::vector<std::string> order = DefaultOrder(layout.ranks[r], names);
    std::map<std::string, std::string> metadata;
    const json fe = st.value(io::RankFileName(r), json::object());
    if (fe.contains("order") && fe["order"].is_array()) {
      std::vector<std::string> recorded;
      for (const json& n : fe["order"]) {
        if (n.is_string()) recorded.push_back(n.get<std::string>());
      }
      std::vector<std::string> a = recorded, b = order;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a == b) order = recorded;  // the same tensors: keep the file's order
    }
    if (fe.contains("metadata") && fe["metadata"].is_object()) {
      for (const auto& [k, v] : fe["metadata"].items()) {
        if (v.is_string()) metadata[k] = v.get<std::string>();
      }
    }
    std::vector<io::SafetensorsEntry> entries;
    for (const std::string& n : order) entries.push_back({n, have[n].dtype, have[n].shape, 0, 0});
    TP_ASSIGN_OR_RETURN(io::SafetensorsWriter w, io::SafetensorsWriter::Create(writer.RankPath(r), entries, metadata));
    for (std::size_t i = 0; i < order.size(); ++i) {
      const TensorInfo& t = have[order[i]];
      if (t.bytes > 0) {
        TP_RETURN_IF_ERROR(client.Read(t, w.data(i)));
        ReportProgress(t.bytes);
      }
      stats.bytes += t.bytes;
      ++stats.tensors;
    }
    TP_RETURN_IF_ERROR(w.Commit());
  }
  io::CheckpointInfo ci;
  ci.model = std::move(model);
  ci.config = config;
  ci.extra = info.value("extra", json::object());
  TP_RETURN_IF_ERROR(writer.Commit(ci, /*checksums=*/true));
  stats.seconds = Since(t0);
  return stats;
}

}  // namespace tenplex::store
