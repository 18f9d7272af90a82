#include "tenplex/transform/cluster.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "tenplex/io/checkpoint.h"
#include "tenplex/model/model.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/store/parse.h"
#include "tenplex/transform/local.h"
#include "tenplex/util/file.h"

namespace tenplex::transform {

using nlohmann::json;

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string RankPrefix(const std::string& job, uint64_t version, int rank) {
  return "jobs/" + job + "/" + std::to_string(version) + "/" + store::RankSegment(rank) + "/";
}

Status CheckFits(const Cluster& cluster, int world_size) {
  if (world_size > cluster.Capacity()) {
    return InvalidArgument("the layout has " + std::to_string(world_size) + " ranks but the cluster has " +
                           std::to_string(cluster.hosts.size()) + " hosts x " +
                           std::to_string(cluster.gpus_per_host) + " GPUs = " +
                           std::to_string(cluster.Capacity()) + " slots");
  }
  return Status::Ok();
}

}  // namespace

std::vector<int> Cluster::RankHosts(int world_size) const {
  std::vector<int> out(world_size);
  for (int r = 0; r < world_size; ++r) out[r] = HostOfRank(r);
  return out;
}

Result<Cluster> ParseCluster(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("cluster: not a JSON object");
  for (const auto& [k, v] : j.items()) {
    if (k != "hosts" && k != "gpus_per_host") {
      return InvalidArgument("cluster: unknown field '" + k + "' (expected hosts, gpus_per_host)");
    }
  }
  if (!j.contains("hosts") || !j["hosts"].is_array() || j["hosts"].empty()) {
    return InvalidArgument("cluster: 'hosts' must be a non-empty array of store URLs");
  }
  if (!j.contains("gpus_per_host") || !j["gpus_per_host"].is_number_integer() ||
      j["gpus_per_host"].get<int64_t>() < 1 || j["gpus_per_host"].get<int64_t>() > 4096) {
    return InvalidArgument("cluster: 'gpus_per_host' must be an integer in [1, 4096]");
  }
  Cluster c;
  c.gpus_per_host = j["gpus_per_host"].get<int>();
  std::set<std::string> seen;
  for (std::size_t i = 0; i < j["hosts"].size(); ++i) {
    const json& h = j["hosts"][i];
    if (!h.is_string() || h.get<std::string>().rfind("http://", 0) != 0 || h.get<std::string>().size() <= 7) {
      return InvalidArgument("cluster: hosts[" + std::to_string(i) + "] must be a URL \"http://host:port\"");
    }
    std::string url = h.get<std::string>();
    if (!seen.insert(url).second) return InvalidArgument("cluster: host " + url + " is listed twice");
    c.hosts.push_back(std::move(url));
  }
  return c;
}

Result<Cluster> ReadClusterFile(const std::string& path) {
  TP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  Result<Cluster> c = ParseCluster(text);
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

Result<std::vector<std::unique_ptr<store::Client>>> ConnectCluster(const Cluster& cluster,
                                                                   const store::ClientOptions& options,
                                                                   bool allow_lost) {
  std::vector<std::unique_ptr<store::Client>> out;
  for (std::size_t h = 0; h < cluster.hosts.size(); ++h) {
    Result<std::unique_ptr<store::Client>> c = store::Client::Connect(cluster.hosts[h], options);
    if (!c.ok() && allow_lost && c.status().code() == StatusCode::kUnavailable) {
      out.push_back(nullptr);
      continue;
    }
    if (!c.ok()) return c.status().WithContext("host " + std::to_string(h) + " (" + cluster.hosts[h] + ")");
    out.push_back(std::move(*c));
  }
  return out;
}

Result<uint64_t> NextCommonVersion(const std::vector<std::unique_ptr<store::Client>>& clients,
                                   const std::string& job) {
  std::vector<store::Client*> raw;
  for (const auto& c : clients) raw.push_back(c.get());
  return NextCommonVersion(raw, job);
}

Result<uint64_t> NextCommonVersion(const std::vector<store::Client*>& clients, const std::string& job) {
  // One past every version any host has had: committed, current, or left open by a
  // coordinator that died (an explicit BeginVersion must not collide with it).
  uint64_t next = 1;
  for (store::Client* c : clients) {
    if (c == nullptr) continue;
    Result<std::string> text = c->CallJson("GET", "/v1/jobs/" + job);
    if (!text.ok()) {
      if (text.status().code() == StatusCode::kNotFound) continue;
      return text.status().WithContext(c->url());
    }
    json j = json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("versions") || !j["versions"].is_array()) {
      return Internal(c->url() + ": malformed reply to GET /v1/jobs/" + job);
    }
    for (const json& v : j["versions"]) {
      if (v.contains("version") && v["version"].is_number_unsigned()) {
        next = std::max(next, v["version"].get<uint64_t>() + 1);
      }
    }
  }
  return next;
}

Result<store::TransferStats> LoadCheckpointToCluster(const Cluster& cluster,
                                                     const std::vector<std::unique_ptr<store::Client>>& clients,
                                                     const std::string& job, const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  TP_RETURN_IF_ERROR(store::CheckJobName(job));
  TP_ASSIGN_OR_RETURN(io::CheckpointInfo info, io::ReadCheckpointInfo(dir));
  TP_ASSIGN_OR_RETURN(Layout layout, MakeLayout(info.model, info.config));
  TP_RETURN_IF_ERROR(CheckFits(cluster, layout.world_size()));
  TP_ASSIGN_OR_RETURN(std::vector<io::SafetensorsFile> files,
                      io::OpenCheckpoint(dir, layout, info, /*verify_checksums=*/true));
  json vinfo = {{"model", json::parse(ModelToJson(info.model))},
                {"config", info.config.ToString()},
                {"extra", info.extra},
                {"source", dir},
                {"cluster", {{"hosts", cluster.hosts}, {"gpus_per_host", cluster.gpus_per_host}}}};
  TP_ASSIGN_OR_RETURN(uint64_t version, NextCommonVersion(clients, job));
  store::TransferStats stats;
  stats.version = version;
  stats.ranks = layout.world_size();
  std::vector<bool> begun(clients.size(), false);
  Status s;
  for (std::size_t h = 0; h < clients.size() && s.ok(); ++h) {
    Result<uint64_t> v = clients[h]->BeginVersion(job, version, vinfo.dump());
    if (!v.ok()) {
      s = v.status().WithContext(clients[h]->url());
    } else {
      begun[h] = true;
    }
  }
  for (int r = 0; r < layout.world_size() && s.ok(); ++r) {
    for (const io::SafetensorsEntry& e : files[r].tensors()) {
      if (!store::IsValidSegment(e.name)) {
        s = InvalidArgument(files[r].path() + ": tensor name '" + e.name + "' cannot be a store path");
      }
    }
    if (!s.ok()) break;
    std::vector<store::Store::AllocRequest> reqs;
    std::vector<const void*> data;
    for (const io::SafetensorsEntry& e : files[r].tensors()) {
      reqs.push_back({RankPrefix(job, version, r) + e.name, e.dtype, e.shape});
      data.push_back(files[r].data(e));
      stats.bytes += e.bytes();
      ++stats.tensors;
    }
    s = clients[cluster.HostOfRank(r)]->WriteMany(reqs, data);
  }
  // Commit on all hosts; a version is only current once every host has committed it.
  for (std::size_t h = 0; h < clients.size() && s.ok(); ++h) {
    s = clients[h]->Commit(job, version);
    if (!s.ok()) s = s.WithContext("committing on " + clients[h]->url());
  }
  if (!s.ok()) {
    for (std::size_t h = 0; h < clients.size(); ++h) {
      if (begun[h]) (void)clients[h]->Abort(job, version);  // best effort
    }
    return s.WithContext("loading " + dir + " into job " + job + " on the cluster");
  }
  stats.seconds = Since(t0);
  return stats;
}

Cluster VersionPlacement(const std::string& info_json, const Cluster& fallback) {
  json info = json::parse(info_json, nullptr, false);
  if (!info.is_discarded() && info.is_object() && info.contains("cluster") && info["cluster"].is_object()) {
    Result<Cluster> c = ParseCluster(info["cluster"].dump());
    if (c.ok()) return *c;
  }
  return fallback;
}

Result<store::TransferStats> SaveCheckpointFromCluster(const Cluster& cluster,
                                                       const std::vector<std::unique_ptr<store::Client>>& clients,
                                                       const std::string& job, const std::string& out) {
  const auto t0 = std::chrono::steady_clock::now();
  TP_RETURN_IF_ERROR(store::CheckJobName(job));
  // The newest current version of any host that answers, and where it lives.
  std::vector<std::optional<store::VersionInfo>> versions(clients.size());
  int ref = -1;
  for (std::size_t h = 0; h < clients.size(); ++h) {
    if (clients[h] == nullptr) continue;
    Result<store::VersionInfo> v = clients[h]->Version(job, std::nullopt);
    if (!v.ok()) {
      if (v.status().code() == StatusCode::kNotFound) continue;
      return v.status().WithContext(clients[h]->url());
    }
    versions[h] = std::move(*v);
    if (ref < 0 || versions[h]->version > versions[ref]->version) ref = static_cast<int>(h);
  }
  if (ref < 0) return NotFound("no host of the cluster holds a version of job '" + job + "'");
  const uint64_t version = versions[ref]->version;
  const Cluster place = VersionPlacement(versions[ref]->info, cluster);
  std::vector<store::Client*> host_clients;  // per host of `place`
  for (const std::string& url : place.hosts) {
    auto it = std::find(cluster.hosts.begin(), cluster.hosts.end(), url);
    if (it == cluster.hosts.end()) {
      return FailedPrecondition("version " + std::to_string(version) + " of job '" + job + "' lives on host " + url +
                                ", which the cluster file does not list");
    }
    const std::size_t h = static_cast<std::size_t>(it - cluster.hosts.begin());
    if (clients[h] == nullptr) return Unavailable("host " + url + " holds part of job '" + job + "' but does not answer");
    if (!versions[h] || versions[h]->version != version || versions[h]->info != versions[ref]->info) {
      return FailedPrecondition("job '" + job + "': host " + url + " has current version " +
                                (versions[h] ? std::to_string(versions[h]->version) : std::string("none")) +
                                " but host " + clients[ref]->url() + " has " + std::to_string(version) +
                                " (or their infos differ)");
    }
    host_clients.push_back(clients[h].get());
  }
  TP_ASSIGN_OR_RETURN(VersionState vs, ParseVersionState(job, version, versions[ref]->info));
  const json info = json::parse(vs.info);
  Model model = std::move(vs.model);
  const ParallelConfig config = vs.config;
  TP_ASSIGN_OR_RETURN(Layout layout, MakeLayout(model, config));
  TP_RETURN_IF_ERROR(CheckFits(place, layout.world_size()));
  std::map<int, std::map<std::string, store::TensorInfo>> by_rank;
  for (std::size_t h = 0; h < host_clients.size(); ++h) {
    TP_ASSIGN_OR_RETURN(std::vector<store::TensorInfo> list,
                        host_clients[h]->List("jobs/" + job + "/" + std::to_string(version) + "/"));
    for (store::TensorInfo& t : list) {
      TP_ASSIGN_OR_RETURN(store::TensorPath p, store::ParseTensorPath(t.path));
      if (p.rank >= layout.world_size() || place.HostOfRank(p.rank) != static_cast<int>(h)) {
        return DataLoss(host_clients[h]->url() + " holds " + t.path + " of rank " + std::to_string(p.rank) +
                        ", which does not live on that host");
      }
      by_rank[p.rank][p.name] = std::move(t);
    }
  }
  store::TransferStats stats;
  stats.version = version;
  stats.ranks = layout.world_size();
  TP_ASSIGN_OR_RETURN(io::CheckpointWriter writer, io::CheckpointWriter::Create(out));
  for (int r = 0; r < layout.world_size(); ++r) {
    std::map<std::string, store::TensorInfo>& have = by_rank[r];
    std::vector<std::string> order;
    std::set<std::string> in_layout;
    for (const LocalTensor& t : *layout.ranks[r].tensors) {
      auto it = have.find(t.name);
      if (it == have.end() || it->second.dtype != t.dtype || it->second.shape != t.shape) {
        return DataLoss("version " + std::to_string(version) + " of job '" + job + "' lacks tensor " + t.name +
                        " of rank " + std::to_string(r) + " (or it has the wrong dtype or shape)");
      }
      order.push_back(t.name);
      in_layout.insert(t.name);
    }
    for (const auto& [n, t] : have) {
      if (!in_layout.count(n)) order.push_back(n);
    }
    std::vector<io::SafetensorsEntry> entries;
    for (const std::string& n : order) entries.push_back({n, have[n].dtype, have[n].shape, 0, 0});
    TP_ASSIGN_OR_RETURN(io::SafetensorsWriter w, io::SafetensorsWriter::Create(writer.RankPath(r), entries, {}));
    store::Client& c = *host_clients[place.HostOfRank(r)];
    for (std::size_t i = 0; i < order.size(); ++i) {
      const store::TensorInfo& t = have[order[i]];
      if (t.bytes > 0) {
        TP_RETURN_IF_ERROR(c.Read(t, w.data(i)));
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

}  // namespace tenplex::transform
