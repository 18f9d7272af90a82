// The state backend of `tenplex run --cluster`: the store daemons of a cluster file.
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <thread>

#include "tenplex/cluster/cluster.h"
#include "tenplex/cluster/distributed.h"
#include "tenplex/cluster/job_lease.h"
#include "tenplex/cluster/two_phase.h"
#include "tenplex/io/state_info.h"
#include "tenplex/runtime/backend.h"
#include "tenplex/runtime/process.h"
#include "tenplex/store/client.h"
#include "tenplex/store/parse.h"
#include "tenplex/util/log.h"

namespace tenplex::runtime {

namespace {

constexpr int kControlTimeoutS = 30;
constexpr int kPresizeTimeoutS = 300;

class ClusterBackend : public StateBackend {
 public:
  static Result<std::unique_ptr<StateBackend>> Open(const RunOptions& o) {
    auto b = std::make_unique<ClusterBackend>();
    TP_ASSIGN_OR_RETURN(b->cluster_, io::ReadClusterFile(o.cluster_path));
    b->co_.token = o.token;
    // Every request of the backend is a control call (versions, infos, 2PC): bounded as
    // tenplex transform's, so a stopped daemon ends the run within this many seconds
    // (the last commit kept) instead of the client's 600 s default.
    b->co_.timeout_s = kControlTimeoutS;
    if (b->co_.token.empty() && std::getenv("TENPLEX_TOKEN") != nullptr)
      b->co_.token = std::getenv("TENPLEX_TOKEN");
    // The run is the job's coordinator while it lasts (cluster/job_lease.h).
    b->co_.coordinator = cluster::NewCoordinator("tenplex-run");
    TP_ASSIGN_OR_RETURN(b->lease_wait_s_, cluster::LeaseWaitFromEnv(60));
    TP_ASSIGN_OR_RETURN(b->clients_, cluster::ConnectCluster(b->cluster_, b->co_));
    for (const auto& c : b->clients_) {
      if (!c->local()) {
        return FailedPrecondition(
            "tenplex run --cluster: the store at " + c->url() +
            " is not on this machine; workers hand their state over through the shared "
            "memory of their host's daemon, so every daemon must run here");
      }
    }
    if (o.work_dir.empty()) {
      return InvalidArgument(
          "tenplex run --cluster needs --work-dir (hand-off files and worker logs)");
    }
    b->work_ = o.work_dir;
    b->file_hosts_ = b->cluster_.hosts;
    b->from_cluster_ = b->cluster_;
    return std::unique_ptr<StateBackend>(std::move(b));
  }

  std::string work_dir() const override { return work_; }

  // The newest current version any host reports; the next transform starts from
  // where it was placed (its info's "cluster").
  Result<std::optional<Committed>> Current(const std::string& job) override {
    // Finish or roll back a commit an earlier run left half done (two_phase.h): a
    // prepared version would otherwise refuse this run's next version (fencing).
    TP_RETURN_IF_ERROR(HoldLease(job));
    TP_ASSIGN_OR_RETURN(cluster::Resolution res,
                        cluster::ResolvePending(cluster_.hosts, Raw(), job, /*owner=*/true));
    for (const std::string& line : res.lines) LogInfo("recovery: %s", line.c_str());
    std::optional<store::VersionInfo> newest;
    for (const auto& c : clients_) {
      Result<store::VersionInfo> v = c->Version(job, std::nullopt);
      if (!v.ok() && v.status().code() == StatusCode::kNotFound) continue;
      if (!v.ok()) return v.status().WithContext(c->url());
      if (!newest || v->version > newest->version) newest = *v;
    }
    if (!newest) return std::optional<Committed>();
    TP_ASSIGN_OR_RETURN(io::StateInfo info, io::ParseStateInfo(job, newest->version, newest->info));
    from_cluster_ = info.placement() ? *info.placement() : cluster_;
    return std::optional<Committed>(Committed{newest->version, std::move(info)});
  }

  Result<uint64_t> BeginLayout(const std::string& job, const Layout& layout,
                               io::StateInfo info) override {
    if (layout.world_size() > cluster_.Capacity()) {
      return FailedPrecondition(
          "config " + layout.config.ToString() + " has " + std::to_string(layout.world_size()) +
          " ranks but the cluster has " + std::to_string(cluster_.Capacity()) + " GPUs");
    }
    info.set_placement(cluster::WithHostIds(cluster_, clients_));
    TP_RETURN_IF_ERROR(HoldLease(job));
    TP_ASSIGN_OR_RETURN(uint64_t v, cluster::NextCommonVersion(clients_, job));
    std::vector<std::vector<store::Store::AllocRequest>> reqs(clients_.size());
    for (const RankLayout& r : layout.ranks) {
      for (const LocalTensor& t : *r.tensors) {
        reqs[cluster_.HostOfRank(r.rank)].push_back(
            {RankTensorPath(job, v, r.rank, t.name), t.dtype, t.shape});
      }
    }
    Status s;
    for (std::size_t h = 0; h < clients_.size() && s.ok(); ++h) {
      if (reqs[h].empty()) continue;  // hosts without ranks keep their older version
      Result<uint64_t> b = clients_[h]->BeginVersion(job, v, info.ToJson());
      if (!b.ok()) {
        s = b.status().WithContext(clients_[h]->url());
        break;
      }
      s = clients_[h]->Allocate(reqs[h]).status();
    }
    if (!s.ok()) {
      Drop(job, v);
      return s;
    }
    return v;
  }

  Result<std::vector<std::map<std::string, std::string>>> Files(const std::string& job, uint64_t v,
                                                                const Layout& layout) override {
    std::vector<std::map<std::string, std::string>> out(layout.world_size());
    for (std::size_t h = 0; h < clients_.size(); ++h) {
      Result<std::vector<store::TensorInfo>> list = clients_[h]->List(store::VersionPrefix(job, v));
      if (!list.ok() && list.status().code() == StatusCode::kNotFound) continue;
      if (!list.ok()) return list.status().WithContext(clients_[h]->url());
      for (const store::TensorInfo& t : *list) {
        TP_ASSIGN_OR_RETURN(store::TensorPath p, store::ParseTensorPath(t.path));
        if (p.rank < layout.world_size()) out[p.rank][p.name] = t.file;
      }
    }
    return out;
  }

  Status Commit(const std::string& job, uint64_t v, const io::StateInfo& info) override {
    // Every part is written (the workers exited 0): set the info everywhere, then the
    // two-phase commit on every host that holds ranks (cluster::PrepareAndCommit).
    std::vector<int> holders = Holders(job, v);
    io::StateInfo full = info;
    full.set_placement(cluster::WithHostIds(cluster_, clients_));
    for (int h : holders) TP_RETURN_IF_ERROR(clients_[h]->SetVersionInfo(job, v, full.ToJson()));
    return cluster::PrepareAndCommit(Raw(), holders, job, v).status();
  }

  // Aborts v on the hosts that have it, the first in commit order first: nothing when it
  // committed v (a commit that failed on a later host is rolled forward by the next
  // Current's recovery, never aborted; cluster/two_phase.h).
  void Drop(const std::string& job, uint64_t v) override {
    Status s = cluster::AbortEverywhere(Raw(), Holders(job, v), job, v);
    if (!s.ok())
      LogInfo("version %llu of job %s is not dropped: %s", static_cast<unsigned long long>(v),
              job.c_str(), s.ToString().c_str());
  }

  ~ClusterBackend() override { (void)WaitPresize(); }

  // Takes the job's lease on every host once, kept (renewed) until the run ends; the
  // Held() error once another coordinator took it from a stopped run.
  Status HoldLease(const std::string& job) {
    if (!lease_) {
      TP_ASSIGN_OR_RETURN(lease_, cluster::JobLease::Acquire(
                                      Raw(), job, co_, {store::kDefaultLeaseMs, lease_wait_s_}));
    }
    return lease_->Held();
  }

  std::vector<store::Client*> Raw() const {
    std::vector<store::Client*> raw;
    for (const auto& c : clients_) raw.push_back(c.get());
    return raw;
  }

  // The hosts that have version v of job (open, prepared or committed).
  std::vector<int> Holders(const std::string& job, uint64_t v) const {
    std::vector<int> holders;
    for (std::size_t h = 0; h < clients_.size(); ++h) {
      if (clients_[h]->Version(job, v).ok()) holders.push_back(static_cast<int>(h));
    }
    return holders;
  }

  void PresizeAhead(const std::string& job, const ParallelConfig& to) override {
    (void)WaitPresize();  // one at a time; an older one's outcome is superseded
    presize_ = std::async(std::launch::async,
                          [from = from_cluster_, live = cluster_, co = co_, job, to]() -> Presized {
                            cluster::ClusterTransformOptions opts;
                            opts.to = live;
                            opts.presize_only = true;
                            // Bounded, so that a run that ends meanwhile does not wait long for it.
                            opts.prepare_timeout_s = kPresizeTimeoutS;
                            const auto t0 = Clock::now();
                            Result<cluster::ClusterTransformStats> ts =
                                cluster::TransformCluster(from, job, to, co, opts);
                            Presized p;
                            p.to = to;
                            p.seconds = Since(t0);
                            if (!ts.ok()) {
                              p.error = ts.status().ToString();
                              return p;
                            }
                            for (const cluster::HostPresizeReport& h : ts->presized) {
                              p.poolable += h.poolable_bytes;
                              p.pooled += std::min(h.pooled_bytes, h.poolable_bytes);
                            }
                            return p;
                          });
  }

  Result<Moved> Transform(const std::string& job, const ParallelConfig& to) override {
    std::optional<Presized> ahead = WaitPresize();
    if (ahead && ahead->to != to) ahead.reset();  // made for another target
    cluster::ClusterTransformOptions opts;
    opts.to = cluster_;  // the live hosts (all of them unless some were killed)
    TP_RETURN_IF_ERROR(HoldLease(job));
    opts.lease_held = true;
    TP_ASSIGN_OR_RETURN(cluster::ClusterTransformStats ts,
                        cluster::TransformCluster(from_cluster_, job, to, co_, opts));
    from_cluster_ = cluster_;
    Moved m{ts.to_version, 0, ts.plan.bytes_total, ts.plan.bytes_in_place};
    if (ahead) {
      m.presized = true;
      m.presize_poolable_bytes = ahead->poolable;
      m.presize_pooled_bytes = ahead->pooled;
      m.presize_seconds = ahead->seconds;
      m.presize_error = ahead->error;
    }
    for (const cluster::HostTransformReport& h : ts.hosts) {
      m.bytes_moved += h.prepare.bytes_kept + h.prepare.bytes_local + h.prepare.bytes_fetched;
      m.bytes_cross_host += h.prepare.bytes_fetched;
    }
    m.cross_host_lower_bound = ts.plan.cross_host_lower_bound;
    return m;
  }

  Status CheckHosts(const std::vector<int>& hosts) const override {
    for (int h : hosts) {
      if (h < 0 || h >= static_cast<int>(file_hosts_.size())) {
        return InvalidArgument("kill host " + std::to_string(h) +
                               " is not a host of the cluster file (" +
                               std::to_string(file_hosts_.size()) + " hosts)");
      }
    }
    return Status::Ok();
  }

  Result<std::vector<int>> RanksOnHosts(const std::vector<int>& hosts, int world) const override {
    TP_RETURN_IF_ERROR(CheckHosts(hosts));
    std::vector<int> ranks;
    for (int r = 0; r < world; ++r) {
      const std::string& url = cluster_.hosts[cluster_.HostOfRank(r)];
      for (int h : hosts) {
        if (file_hosts_[h] == url) ranks.push_back(r);
      }
    }
    return ranks;
  }

  Result<std::vector<std::string>> KillHosts(const std::vector<int>& hosts) override {
    TP_RETURN_IF_ERROR(CheckHosts(hosts));
    (void)WaitPresize();  // it talks to the daemons about to go
    std::vector<std::string> killed;
    for (int h : hosts) {
      const std::string& url = file_hosts_[h];
      auto it = std::find(cluster_.hosts.begin(), cluster_.hosts.end(), url);
      if (it == cluster_.hosts.end())
        return FailedPrecondition("host " + url + " was already lost");
      const std::size_t at = static_cast<std::size_t>(it - cluster_.hosts.begin());
      const int64_t pid = clients_[at]->pid();
      if (pid <= 0)
        return FailedPrecondition("the store daemon at " + url + " does not say its process id");
      if (::kill(static_cast<pid_t>(pid), SIGKILL) != 0)
        return ErrnoError("kill the store daemon at " + url, errno);
      // Gone once it no longer answers (its sockets close when it dies).
      const auto t0 = Clock::now();
      while (clients_[at]->CallJson("GET", "/v1/health").ok() && Since(t0) < 5) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      clients_.erase(clients_.begin() + static_cast<std::ptrdiff_t>(at));
      cluster_.hosts.erase(it);
      killed.push_back(url);
    }
    return killed;
  }

 private:
  struct Presized {
    ParallelConfig to;  // the target it was made for
    int64_t poolable = 0, pooled = 0;
    double seconds = 0;
    std::string error;
  };

  // The outcome of the PresizeAhead in flight, once it is done; nullopt when none ran.
  std::optional<Presized> WaitPresize() {
    if (!presize_.valid()) return std::nullopt;
    return presize_.get();
  }

  io::Cluster cluster_;       // the live hosts
  io::Cluster from_cluster_;  // where the committed version was placed (incl. lost hosts)
  std::vector<std::string> file_hosts_;
  store::ClientOptions co_;
  std::vector<std::unique_ptr<store::Client>> clients_;
  double lease_wait_s_ = 60;
  std::unique_ptr<cluster::JobLease> lease_;  // HoldLease's, for the whole run
  std::string work_;
  std::future<Presized> presize_;  // PresizeAhead's, until Transform or KillHosts takes it
};

}  // namespace

Result<std::unique_ptr<StateBackend>> OpenClusterBackend(const RunOptions& o) {
  return ClusterBackend::Open(o);
}

}  // namespace tenplex::runtime
