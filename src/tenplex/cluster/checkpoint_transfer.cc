#include "tenplex/cluster/checkpoint_transfer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "tenplex/cluster/cluster_state.h"
#include "tenplex/cluster/job_listing.h"
#include "tenplex/cluster/two_phase.h"
#include "tenplex/io/checkpoint.h"
#include "tenplex/io/state_info.h"
#include "tenplex/plan/planner.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/store/parse.h"
#include "tenplex/transform/host_exec.h"
#include "tenplex/util/log.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::cluster {

using nlohmann::json;

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string Versioned(const std::string& job, uint64_t version) {
  return "version " + std::to_string(version) + " of job '" + job + "'";
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

// How rank file r was laid out when it was loaded: its tensor order when the info
// recorded one for the same tensors (else the default), and its __metadata__.
struct RankFileShape {
  std::vector<std::string> order;
  std::map<std::string, std::string> metadata;
};

RankFileShape RecordedShape(const StateInfo& info, const RankLayout& rank,
                            const std::set<std::string>& names) {
  RankFileShape out;
  out.order = DefaultOrder(rank, names);
  const json& st = info.field("safetensors");
  if (!st.is_object()) return out;
  auto fe = st.find(io::RankFileName(rank.rank));
  if (fe == st.end() || !fe->is_object()) return out;
  if (fe->contains("order") && (*fe)["order"].is_array()) {
    std::vector<std::string> recorded;
    for (const json& n : (*fe)["order"]) {
      if (n.is_string()) recorded.push_back(n.get<std::string>());
    }
    std::vector<std::string> a = recorded, b = out.order;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a == b) out.order = std::move(recorded);  // the same tensors: keep the file's order
  }
  if (fe->contains("metadata") && (*fe)["metadata"].is_object()) {
    for (const auto& [k, v] : (*fe)["metadata"].items()) {
      if (v.is_string()) out.metadata[k] = v.get<std::string>();
    }
  }
  return out;
}

Status CheckFits(const Cluster& cluster, int world_size) {
  if (world_size > cluster.Capacity()) {
    return InvalidArgument("the layout has " + std::to_string(world_size) +
                           " ranks but the cluster has " + std::to_string(cluster.hosts.size()) +
                           " hosts x " + std::to_string(cluster.gpus_per_host) +
                           " GPUs = " + std::to_string(cluster.Capacity()) + " slots");
  }
  return Status::Ok();
}

// A single store: one host that holds every rank.
Cluster SingleHost(const store::Client& client) {
  return Cluster{{client.url()}, std::numeric_limits<int>::max()};
}

// The info's "safetensors" field: per rank file its __metadata__ and, when it differs
// from the default, its tensor order (so a save writes the same files back). Tensor
// names must be store path segments.
Result<json> RecordFileShapes(const Layout& layout, const std::vector<io::SafetensorsFile>& files) {
  json st = json::object();
  for (int r = 0; r < layout.world_size(); ++r) {
    const io::SafetensorsFile& f = files[r];
    std::set<std::string> names;
    std::vector<std::string> order;
    for (const io::SafetensorsEntry& e : f.tensors()) {
      if (!store::IsValidSegment(e.name)) {
        return InvalidArgument(
            f.path() + ": tensor name '" + e.name +
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
  return st;
}

// Writes every rank's tensors into the open version on its host. A host that stops
// answering is marked not begun (each request to it would wait for the timeout again:
// the next operation on the job removes its open version).
Status WriteRanks(const Cluster& cluster, const std::vector<store::Client*>& clients,
                  const std::string& job, const std::vector<io::SafetensorsFile>& files,
                  bool single, std::vector<bool>& begun, TransferStats& stats) {
  for (int r = 0; r < static_cast<int>(files.size()); ++r) {
    std::vector<store::Store::AllocRequest> reqs;
    std::vector<const void*> data;
    for (const io::SafetensorsEntry& e : files[r].tensors()) {
      reqs.push_back({store::TensorPathOf(job, stats.version, r, e.name), e.dtype, e.shape});
      data.push_back(files[r].data(e));
      stats.bytes += e.bytes();
      ++stats.tensors;
    }
    const int h = single ? 0 : cluster.HostOfRank(r);
    Status s = clients[h]->WriteMany(reqs, data);
    if (s.code() == StatusCode::kUnavailable) begun[h] = false;
    for (const io::SafetensorsEntry& e : files[r].tensors()) ReportProgress(e.bytes());
    TP_RETURN_IF_ERROR(s);
  }
  return Status::Ok();
}

// Finishes or rolls back what a crashed transform, load or save left half done
// (two_phase.h; `owner`: a loader may roll back, a reader only rolls forward what every
// participant prepared), from `listing`, read from every host once; re-read only when that
// changed something (job_listing.h), so that the caller goes on from the same one listing.
Status ResolveFromListing(const Cluster& cluster, const std::vector<store::Client*>& clients,
                          const std::string& job, bool owner, JobListing& listing) {
  TP_ASSIGN_OR_RETURN(Resolution res, ResolvePending(cluster.hosts, clients, job, owner, listing));
  if (res.changed) listing = ReadJobListing(clients, job);
  return Status::Ok();
}

// Opens the new version on the first `used` hosts (at `want` when given), recording
// which were begun.
Status BeginEverywhere(const std::vector<store::Client*>& clients, const std::string& job,
                       std::optional<uint64_t> want, const std::string& info_text,
                       std::vector<bool>& begun, TransferStats& stats) {
  for (std::size_t h = 0; h < begun.size(); ++h) {
    Result<uint64_t> v = clients[h]->BeginVersion(job, want, info_text);
    if (!v.ok()) return v.status().WithContext(clients[h]->url());
    begun[h] = true;
    stats.version = *v;
    want = *v;
  }
  return Status::Ok();
}

Result<TransferStats> Load(const Cluster& cluster, const std::vector<store::Client*>& clients,
                           const std::string& job, const std::string& dir, bool single,
                           bool verify) {
  const auto t0 = std::chrono::steady_clock::now();
  TP_RETURN_IF_ERROR(store::CheckJobName(job));
  TP_ASSIGN_OR_RETURN(io::CheckpointInfo ci, io::ReadCheckpointInfo(dir));
  TP_ASSIGN_OR_RETURN(Layout layout, MakeLayout(ci.model, ci.config));
  const int world = layout.world_size();
  TP_RETURN_IF_ERROR(CheckFits(cluster, world));
  TP_ASSIGN_OR_RETURN(std::vector<io::SafetensorsFile> files,
                      io::OpenCheckpoint(dir, layout, ci, verify, &ThreadPool::Default()));
  TransferStats stats;
  stats.ranks = world;
  stats.verified = verify;
  StateInfo info = StateInfo::FromCheckpoint(ci, dir);
  TP_ASSIGN_OR_RETURN(json st, RecordFileShapes(layout, files));
  if (!st.empty()) info.set_field("safetensors", st);
  // The hosts that get ranks: a prefix of the cluster.
  const int k = cluster.gpus_per_host;
  const std::size_t used = single ? 1 : static_cast<std::size_t>((world + k - 1) / k);
  for (std::size_t h = 0; h < used; ++h) {
    if (clients[h] == nullptr) {
      return Unavailable("host " + std::to_string(h) + " (" + cluster.hosts[h] +
                         ") gets ranks but does not answer");
    }
    stats.hosts.push_back(cluster.hosts[h]);
  }
  std::optional<uint64_t> want;
  if (!single) {
    info.set_placement(WithHostIds(Cluster{stats.hosts, k}, clients));
    // Finish or roll back what a crashed transform or load left half done, so that the
    // new version lands on one state everywhere, numbered above every one in use.
    JobListing listing = ReadJobListing(clients, job);
    TP_RETURN_IF_ERROR(ResolveFromListing(cluster, clients, job, /*owner=*/true, listing));
    TP_ASSIGN_OR_RETURN(want, NextCommonVersion(clients, listing));
  }
  stats.shm = true;
  for (std::size_t h = 0; h < used; ++h) stats.shm = stats.shm && clients[h]->local();
  std::vector<bool> begun(used, false);
  Status s = BeginEverywhere(clients, job, want, info.ToJson(), begun, stats);
  if (s.ok()) s = WriteRanks(cluster, clients, job, files, single, begun, stats);
  if (s.ok() && single) s = clients[0]->Commit(job, stats.version);
  if (s.ok() && !single) {
    // The two-phase commit (two_phase.h): a failed prepare is aborted everywhere there; a
    // failure after the decision is never aborted (recovery rolls it forward).
    std::vector<int> participants;
    for (std::size_t h = 0; h < used; ++h) participants.push_back(static_cast<int>(h));
    Result<CommitOutcome> c = PrepareAndCommit(clients, participants, job, stats.version);
    if (!c.ok()) return c.status().WithContext("loading " + dir + " into job " + job);
    for (int h : c->unconfirmed) stats.unconfirmed_hosts.push_back(cluster.hosts[h]);
  }
  if (!s.ok()) {
    for (std::size_t h = 0; h < used; ++h) {
      if (begun[h]) (void)clients[h]->Abort(job, stats.version);  // best effort; never committed
    }
    return s.WithContext("loading " + dir + " into job " + job + (single ? "" : " on the cluster"));
  }
  stats.seconds = Since(t0);
  return stats;
}

// What the holders of a committed version have: by rank (name -> tensor) and by host
// (path -> tensor).
struct Holdings {
  std::vector<std::map<std::string, store::TensorInfo>> by_rank;
  std::map<int, std::map<std::string, store::TensorInfo>> by_path;
};

// Lists every holder's tensors of the version; a tensor of a rank that does not live on
// its host is DataLoss. Adds each holder to stats.hosts.
Result<Holdings> ListHoldings(const Cluster& cluster, const std::vector<store::Client*>& clients,
                              const std::string& job, const CommittedState& cs, int world,
                              TransferStats& stats) {
  Holdings out;
  out.by_rank.resize(world);
  for (int h : cs.holders) {
    TP_ASSIGN_OR_RETURN(std::vector<store::TensorInfo> list,
                        clients[h]->List(store::VersionPrefix(job, cs.version)));
    for (store::TensorInfo& t : list) {
      TP_ASSIGN_OR_RETURN(store::TensorPath p, store::ParseTensorPath(t.path));
      if (p.rank >= world || cs.rank_hosts[p.rank] != h) {
        return DataLoss(clients[h]->url() + " holds " + t.path + " of rank " +
                        std::to_string(p.rank) + ", which does not live on that host in config " +
                        cs.info.config().ToString());
      }
      out.by_path[h][t.path] = t;
      out.by_rank[p.rank][p.name] = std::move(t);
    }
    stats.hosts.push_back(cluster.hosts[h]);
  }
  return out;
}

// The ranks on lost hosts. Every surviving rank must have each tensor of the layout with
// its dtype and shape; *extras tells whether one holds tensors outside the layout.
Result<std::vector<int>> LostRanks(const CommittedState& cs, const Layout& layout,
                                   const Holdings& have, const std::string& what, bool* extras) {
  std::vector<int> lost;
  *extras = false;
  for (int r = 0; r < layout.world_size(); ++r) {
    if (cs.rank_hosts[r] == plan::kLostHost) {
      lost.push_back(r);
      continue;
    }
    std::set<std::string> in_layout;
    for (const LocalTensor& t : *layout.ranks[r].tensors) {
      in_layout.insert(t.name);
      auto it = have.by_rank[r].find(t.name);
      if (it == have.by_rank[r].end()) {
        return DataLoss(what + " lacks tensor " + t.name + " of rank " + std::to_string(r));
      }
      if (it->second.dtype != t.dtype || it->second.shape != t.shape) {
        return DataLoss(it->second.path + " is " + std::string(DTypeName(it->second.dtype)) + " [" +
                        ShapeToString(it->second.shape) + "] but the layout needs " +
                        std::string(DTypeName(t.dtype)) + " [" + ShapeToString(t.shape) + "]");
      }
    }
    for (const auto& [n, t] : have.by_rank[r]) *extras = *extras || !in_layout.count(n);
  }
  return lost;
}

// The ranks of lost hosts, from replicas: the plan of the move of the same layout onto a
// virtual saver host (to_hosts[r] = saver for the lost ranks), surviving ranks staying
// in place.
Result<plan::Plan> PlanRebuild(const Layout& layout, const CommittedState& cs,
                               const std::vector<int>& lost, bool extras, int saver,
                               const std::string& what, std::vector<int>& to_hosts,
                               TransferStats& stats) {
  std::string lost_urls;
  for (const std::string& u : stats.lost_hosts) lost_urls += (lost_urls.empty() ? "" : ", ") + u;
  const std::string why = std::to_string(lost.size()) + " of " +
                          std::to_string(layout.world_size()) + " ranks of " + what +
                          " are on hosts that are lost (" +
                          (lost_urls.empty() ? "stale or not listed" : lost_urls) + ")";
  if (extras) {
    return DataLoss(why +
                    " and ranks hold tensors outside the layout, which have no replicas to "
                    "rebuild them from");
  }
  for (int r : lost) to_hosts[r] = saver;
  Result<plan::Plan> p = plan::MakePlan(cs.info.model(), layout, layout, cs.rank_hosts, to_hosts);
  if (!p.ok()) return p.status().WithContext(why);
  stats.rebuilt_ranks = static_cast<int>(lost.size());
  return p;
}

// Creates every rank file (the recorded order and metadata) and fills the surviving
// ranks' tensors from their stores; dst[r] gets a lost rank r's destinations, one per
// local tensor of the layout, for the rebuild.
Result<std::vector<io::SafetensorsWriter>> WriteRankFiles(
    const io::CheckpointWriter& writer, const std::vector<store::Client*>& clients,
    const CommittedState& cs, const Layout& layout, Holdings& have,
    std::vector<std::vector<void*>>& dst, TransferStats& stats) {
  std::vector<io::SafetensorsWriter> files;
  for (int r = 0; r < layout.world_size(); ++r) {
    const bool is_lost = cs.rank_hosts[r] == plan::kLostHost;
    std::set<std::string> names;
    if (is_lost) {
      for (const LocalTensor& t : *layout.ranks[r].tensors) names.insert(t.name);
    } else {
      for (const auto& [n, t] : have.by_rank[r]) names.insert(n);
    }
    RankFileShape shape = RecordedShape(cs.info, layout.ranks[r], names);
    std::map<std::string, std::pair<DType, Shape>> types;
    for (const LocalTensor& t : *layout.ranks[r].tensors) types[t.name] = {t.dtype, t.shape};
    for (const auto& [n, t] : have.by_rank[r]) types[n] = {t.dtype, t.shape};
    std::vector<io::SafetensorsEntry> entries;
    for (const std::string& n : shape.order)
      entries.push_back({n, types[n].first, types[n].second, 0, 0});
    TP_ASSIGN_OR_RETURN(io::SafetensorsWriter w,
                        io::SafetensorsWriter::Create(writer.RankPath(r), entries, shape.metadata));
    if (is_lost) {
      for (const LocalTensor& t : *layout.ranks[r].tensors) {
        auto at = std::find(shape.order.begin(), shape.order.end(), t.name) - shape.order.begin();
        dst[r].push_back(w.data(static_cast<std::size_t>(at)));
        stats.bytes += t.bytes();
        ++stats.tensors;
      }
    } else {
      store::Client& c = *clients[cs.rank_hosts[r]];
      for (std::size_t i = 0; i < shape.order.size(); ++i) {
        const store::TensorInfo& t = have.by_rank[r][shape.order[i]];
        if (t.bytes > 0) TP_RETURN_IF_ERROR(c.Read(t, w.data(i)));
        ReportProgress(t.bytes);
        stats.bytes += t.bytes;
        ++stats.tensors;
      }
    }
    files.push_back(std::move(w));
  }
  return files;
}

// Runs the rebuild plan on the saver host: each replica's tensor is read whole from its
// store, then its runs are copied into dst.
Status RebuildLostRanks(const plan::Plan& rebuild, const Layout& layout, const CommittedState& cs,
                        const std::vector<int>& to_hosts, int saver, const Holdings& have,
                        const std::vector<store::Client*>& clients, const std::string& job,
                        const std::vector<std::vector<void*>>& dst) {
  const std::vector<std::vector<const void*>> src(layout.world_size());  // saver: no old rank
  transform::HostExecInput in;
  in.plan = &rebuild;
  in.from = &layout;
  in.to = &layout;
  in.from_hosts = &cs.rank_hosts;
  in.to_hosts = &to_hosts;
  in.host = saver;
  in.src = &src;
  in.dst = &dst;
  in.pool = &ThreadPool::Default();
  in.region_name = [&](int rank, int tensor) {
    return store::TensorPathOf(job, cs.version, rank, (*layout.ranks[rank].tensors)[tensor].name);
  };
  in.fetch = [&](int peer, const std::vector<transport::ReadRequest>& reqs) -> Status {
    std::vector<uint8_t> buf;
    auto host = have.by_path.find(peer);
    for (const transport::ReadRequest& req : reqs) {
      if (host == have.by_path.end() || !host->second.count(req.region))
        return DataLoss(clients[peer]->url() + " lacks " + req.region);
      auto it = host->second.find(req.region);
      buf.resize(it->second.bytes);
      if (!buf.empty()) TP_RETURN_IF_ERROR(clients[peer]->Read(it->second, buf.data()));
      for (const transport::ReadRun& run : req.runs) {
        if (run.offset + run.length > buf.size())
          return Internal("a read run is outside " + req.region);
        std::memcpy(run.dest, buf.data() + run.offset, run.length);
      }
    }
    return Status::Ok();
  };
  return transform::ExecuteHostPart(in).status();
}

Result<TransferStats> Save(const Cluster& cluster, const std::vector<store::Client*>& clients,
                           const std::string& job, const std::string& out, bool single) {
  const auto t0 = std::chrono::steady_clock::now();
  TP_RETURN_IF_ERROR(store::CheckJobName(job));
  JobListing listing = ReadJobListing(clients, job);
  if (!single)  // a reader only rolls forward what every participant prepared
    TP_RETURN_IF_ERROR(ResolveFromListing(cluster, clients, job, /*owner=*/false, listing));
  TP_ASSIGN_OR_RETURN(CommittedState cs,
                      FindCommittedState(cluster.hosts, clients, job, cluster, listing));
  const std::string what = Versioned(job, cs.version);
  if (single) {  // everything is in the one store, wherever the info says it was placed
    cs.placement = cluster;
    cs.rank_hosts.assign(cs.info.config().world_size(), 0);
    cs.holders = {0};
  }
  TP_ASSIGN_OR_RETURN(Layout layout, MakeLayout(cs.info.model(), cs.info.config()));
  const int world = layout.world_size();
  TransferStats stats;
  stats.version = cs.version;
  stats.ranks = world;
  for (int h : cs.unavailable) stats.lost_hosts.push_back(cluster.hosts[h]);
  TP_ASSIGN_OR_RETURN(Holdings have, ListHoldings(cluster, clients, job, cs, world, stats));
  bool extras = false;  // tensors outside the layout on a surviving rank
  TP_ASSIGN_OR_RETURN(std::vector<int> lost, LostRanks(cs, layout, have, what, &extras));
  std::optional<plan::Plan> rebuild;
  std::vector<int> to_hosts = cs.rank_hosts;
  const int saver = static_cast<int>(clients.size());
  if (!lost.empty()) {
    TP_ASSIGN_OR_RETURN(rebuild,
                        PlanRebuild(layout, cs, lost, extras, saver, what, to_hosts, stats));
  }
  TP_ASSIGN_OR_RETURN(io::CheckpointWriter writer, io::CheckpointWriter::Create(out));
  std::vector<std::vector<void*>> dst(world);  // lost ranks: [local tensor] -> bytes in its file
  TP_ASSIGN_OR_RETURN(std::vector<io::SafetensorsWriter> files,
                      WriteRankFiles(writer, clients, cs, layout, have, dst, stats));
  if (rebuild) {
    Status st = RebuildLostRanks(*rebuild, layout, cs, to_hosts, saver, have, clients, job, dst);
    if (!st.ok()) return st.WithContext("rebuilding the ranks of lost hosts of " + what);
  }
  for (io::SafetensorsWriter& w : files) TP_RETURN_IF_ERROR(w.Commit());
  TP_RETURN_IF_ERROR(writer.Commit(cs.info.ToCheckpoint(), /*checksums=*/true));
  stats.shm = true;
  for (int h : cs.holders) stats.shm = stats.shm && clients[h]->local();
  stats.seconds = Since(t0);
  return stats;
}

std::vector<store::Client*> Raw(const std::vector<std::unique_ptr<store::Client>>& clients) {
  std::vector<store::Client*> out;
  for (const auto& c : clients) out.push_back(c.get());
  return out;
}

}  // namespace

Result<TransferStats> LoadCheckpoint(store::Client& client, const std::string& job,
                                     const std::string& dir, bool verify) {
  return Load(SingleHost(client), {&client}, job, dir, /*single=*/true, verify);
}

Result<TransferStats> SaveCheckpoint(store::Client& client, const std::string& job,
                                     const std::string& out) {
  return Save(SingleHost(client), {&client}, job, out, /*single=*/true);
}

Result<TransferStats> LoadCheckpointToCluster(
    const Cluster& cluster, const std::vector<std::unique_ptr<store::Client>>& clients,
    const std::string& job, const std::string& dir, bool verify) {
  if (clients.size() != cluster.hosts.size())
    return InvalidArgument("one client per host of the cluster");
  return Load(cluster, Raw(clients), job, dir, /*single=*/false, verify);
}

Result<TransferStats> SaveCheckpointFromCluster(
    const Cluster& cluster, const std::vector<std::unique_ptr<store::Client>>& clients,
    const std::string& job, const std::string& out) {
  if (clients.size() != cluster.hosts.size())
    return InvalidArgument("one client per host of the cluster");
  return Save(cluster, Raw(clients), job, out, /*single=*/false);
}

}  // namespace tenplex::cluster
