#include "tenplex/runtime/runner.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "tenplex/policy/policy.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/runtime/schedule.h"
#include "tenplex/store/parse.h"
#include "tenplex/store/store.h"
#include "tenplex/store/client.h"
#include "tenplex/transform/cluster.h"
#include "tenplex/transform/distributed.h"
#include "tenplex/transform/local.h"
#include "tenplex/util/file.h"
#include "tenplex/util/format.h"

namespace tenplex::runtime {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// SIGINT/SIGTERM while the runner waits for workers (they run in their own process
// groups, so a terminal's Ctrl-C reaches only the runner): it kills them, drops the
// open version and returns, leaving the last committed version in the store.
volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void OnInterrupt(int sig) { g_interrupted = sig; }

class InterruptGuard {
 public:
  InterruptGuard() {
    g_interrupted = 0;
    struct sigaction sa {};
    sa.sa_handler = OnInterrupt;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~InterruptGuard() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Result<int> FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return ErrnoError("socket", errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError("bind a free port", err);
  }
  ::close(fd);
  return static_cast<int>(ntohs(a.sin_port));
}

Status AppendLine(const std::string& path, const json& j) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("open " + path, errno);
  std::string line = j.dump() + "\n";
  ssize_t n = ::write(fd, line.data(), line.size());
  int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size())) return ErrnoError("append to " + path, err);
  return Status::Ok();
}

// Follows the log file: new complete lines since the last call.
class LogTail {
 public:
  explicit LogTail(std::string path) : path_(std::move(path)) {
    struct stat st;
    if (::stat(path_.c_str(), &st) == 0) offset_ = st.st_size;
  }
  std::vector<json> Poll() {
    std::vector<json> out;
    int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return out;
    char buf[1 << 16];
    for (;;) {
      ssize_t n = ::pread(fd, buf, sizeof(buf), offset_);
      if (n <= 0) break;
      offset_ += n;
      partial_.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    std::size_t pos;
    while ((pos = partial_.find('\n')) != std::string::npos) {
      json j = json::parse(partial_.substr(0, pos), nullptr, false);
      partial_.erase(0, pos + 1);
      if (!j.is_discarded() && j.is_object()) out.push_back(std::move(j));
    }
    return out;
  }

 private:
  std::string path_;
  off_t offset_ = 0;
  std::string partial_;
};

struct Worker {
  pid_t pid = -1;
  int rank = 0;
  std::string log;
  bool exited = false;
  int status = 0;
};

Result<Worker> Spawn(const std::vector<std::string>& argv, int rank, const std::string& log) {
  Worker w;
  w.rank = rank;
  w.log = log;
  pid_t pid = ::fork();
  if (pid < 0) return ErrnoError("fork", errno);
  if (pid == 0) {
    ::setpgid(0, 0);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  w.pid = pid;
  return w;
}

std::string Tail(const std::string& path, std::size_t bytes = 2000) {
  auto text = ReadFile(path);
  if (!text.ok()) return "";
  return text->size() > bytes ? text->substr(text->size() - bytes) : *text;
}

std::string TensorPath(const std::string& job, uint64_t v, int rank, const std::string& name) {
  return "jobs/" + job + "/" + std::to_string(v) + "/" + store::RankSegment(rank) + "/" + name;
}

// Where the job's state lives between segments: the store embedded in the runner, or
// the store daemons of a cluster file (rank r on host r / K, every daemon on this
// machine so that workers map its shared memory). The runner drives both the same way.
class StateBackend {
 public:
  virtual ~StateBackend() = default;
  virtual std::string work_dir() const = 0;
  // Opens a new version laid out for `layout`, every tensor allocated (zero-filled).
  virtual Result<uint64_t> BeginLayout(const std::string& job, const Layout& layout, json info) = 0;
  // The shared-memory file of every tensor of every rank of version v.
  virtual Result<std::vector<std::map<std::string, std::string>>> Files(const std::string& job, uint64_t v,
                                                                        const Layout& layout) = 0;
  virtual Status Commit(const std::string& job, uint64_t v, const json& info) = 0;
  virtual void Drop(const std::string& job, uint64_t v) = 0;
  struct Moved {
    uint64_t version = 0;
    int64_t bytes_moved = 0, bytes_total = 0, bytes_in_place = 0;
  };
  // Transforms the committed version to `to`, committed.
  virtual Result<Moved> Transform(const std::string& job, const ParallelConfig& to) = 0;
  // Host failures (kill_hosts; the cluster backend only): the ranks of a world of
  // `world` ranks that live on those hosts (indexes into the cluster file), and killing
  // their daemons. The backend then goes on with the other hosts; the next Transform
  // re-places the state on them.
  virtual Status CheckHosts(const std::vector<int>& hosts) const {
    if (hosts.empty()) return Status::Ok();
    return InvalidArgument("kill_hosts needs tenplex run --cluster (store daemons as hosts)");
  }
  virtual Result<std::vector<int>> RanksOnHosts(const std::vector<int>& hosts, int world) const {
    TP_RETURN_IF_ERROR(CheckHosts(hosts));
    (void)world;
    return std::vector<int>{};
  }
  virtual Result<std::vector<std::string>> KillHosts(const std::vector<int>& hosts) {
    TP_RETURN_IF_ERROR(CheckHosts(hosts));
    return std::vector<std::string>{};
  }
};

class EmbeddedBackend : public StateBackend {
 public:
  static Result<std::unique_ptr<StateBackend>> Open(const RunOptions& o) {
    auto b = std::make_unique<EmbeddedBackend>();
    store::StoreOptions so;
    so.shm_dir = o.shm_dir;
    TP_ASSIGN_OR_RETURN(b->st_, store::Store::Open(so));
    b->work_ = o.work_dir.empty() ? b->st_->shm_dir() + "/run" : o.work_dir;
    return std::unique_ptr<StateBackend>(std::move(b));
  }
  std::string work_dir() const override { return work_; }
  Result<uint64_t> BeginLayout(const std::string& job, const Layout& layout, json info) override {
    TP_ASSIGN_OR_RETURN(uint64_t v, st_->BeginVersion(job, std::nullopt, info.dump()));
    for (const RankLayout& r : layout.ranks) {
      for (const LocalTensor& t : *r.tensors) {
        auto w = st_->Allocate(TensorPath(job, v, r.rank, t.name), t.dtype, t.shape);
        if (!w.ok()) {
          (void)st_->DropVersion(job, v);
          return w.status();
        }
      }
    }
    return v;
  }
  Result<std::vector<std::map<std::string, std::string>>> Files(const std::string& job, uint64_t v,
                                                                const Layout& layout) override {
    std::vector<std::map<std::string, std::string>> out(layout.world_size());
    for (const RankLayout& r : layout.ranks) {
      for (const LocalTensor& t : *r.tensors) {
        TP_ASSIGN_OR_RETURN(store::TensorInfo ti, st_->Meta(TensorPath(job, v, r.rank, t.name)));
        out[r.rank][t.name] = ti.file;
      }
    }
    return out;
  }
  Status Commit(const std::string& job, uint64_t v, const json& info) override {
    TP_RETURN_IF_ERROR(st_->SetVersionInfo(job, v, info.dump()));
    return st_->Commit(job, v);
  }
  void Drop(const std::string& job, uint64_t v) override { (void)st_->DropVersion(job, v); }
  Result<Moved> Transform(const std::string& job, const ParallelConfig& to) override {
    TP_ASSIGN_OR_RETURN(transform::LocalTransformStats ts, transform::TransformLocal(*st_, job, to));
    return Moved{ts.new_version, ts.bytes_copied, ts.plan.bytes_total, ts.plan.bytes_in_place};
  }

 private:
  std::unique_ptr<store::Store> st_;
  std::string work_;
};

class ClusterBackend : public StateBackend {
 public:
  static Result<std::unique_ptr<StateBackend>> Open(const RunOptions& o) {
    auto b = std::make_unique<ClusterBackend>();
    TP_ASSIGN_OR_RETURN(b->cluster_, transform::ReadClusterFile(o.cluster_path));
    b->co_.token = o.token;
    if (b->co_.token.empty() && std::getenv("TENPLEX_TOKEN") != nullptr) b->co_.token = std::getenv("TENPLEX_TOKEN");
    TP_ASSIGN_OR_RETURN(b->clients_, transform::ConnectCluster(b->cluster_, b->co_));
    for (const auto& c : b->clients_) {
      if (!c->local()) {
        return FailedPrecondition("tenplex run --cluster: the store at " + c->url() +
                                  " is not on this machine; workers hand their state over through the shared "
                                  "memory of their host's daemon, so every daemon must run here");
      }
    }
    if (o.work_dir.empty()) {
      return InvalidArgument("tenplex run --cluster needs --work-dir (hand-off files and worker logs)");
    }
    b->work_ = o.work_dir;
    b->file_hosts_ = b->cluster_.hosts;
    b->from_cluster_ = b->cluster_;
    return std::unique_ptr<StateBackend>(std::move(b));
  }
  std::string work_dir() const override { return work_; }
  Result<uint64_t> BeginLayout(const std::string& job, const Layout& layout, json info) override {
    if (layout.world_size() > cluster_.Capacity()) {
      return FailedPrecondition("config " + layout.config.ToString() + " has " + std::to_string(layout.world_size()) +
                                " ranks but the cluster has " + std::to_string(cluster_.Capacity()) + " GPUs");
    }
    info["cluster"] = {{"hosts", cluster_.hosts}, {"gpus_per_host", cluster_.gpus_per_host}};
    TP_ASSIGN_OR_RETURN(uint64_t v, transform::NextCommonVersion(clients_, job));
    std::vector<std::vector<store::Store::AllocRequest>> reqs(clients_.size());
    for (const RankLayout& r : layout.ranks) {
      for (const LocalTensor& t : *r.tensors) {
        reqs[cluster_.HostOfRank(r.rank)].push_back({TensorPath(job, v, r.rank, t.name), t.dtype, t.shape});
      }
    }
    Status s;
    for (std::size_t h = 0; h < clients_.size() && s.ok(); ++h) {
      if (reqs[h].empty()) continue;  // hosts without ranks keep their older version
      Result<uint64_t> b = clients_[h]->BeginVersion(job, v, info.dump());
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
      Result<std::vector<store::TensorInfo>> list = clients_[h]->List("jobs/" + job + "/" + std::to_string(v) + "/");
      if (!list.ok() && list.status().code() == StatusCode::kNotFound) continue;
      if (!list.ok()) return list.status().WithContext(clients_[h]->url());
      for (const store::TensorInfo& t : *list) {
        TP_ASSIGN_OR_RETURN(store::TensorPath p, store::ParseTensorPath(t.path));
        if (p.rank < layout.world_size()) out[p.rank][p.name] = t.file;
      }
    }
    return out;
  }
  Status Commit(const std::string& job, uint64_t v, const json& info) override {
    // Every part is written (the workers exited 0): set the info everywhere, then
    // commit on every host that holds ranks.
    std::vector<std::size_t> holders;
    for (std::size_t h = 0; h < clients_.size(); ++h) {
      if (clients_[h]->Version(job, v).ok()) holders.push_back(h);
    }
    json full = info;
    full["cluster"] = {{"hosts", cluster_.hosts}, {"gpus_per_host", cluster_.gpus_per_host}};
    for (std::size_t h : holders) TP_RETURN_IF_ERROR(clients_[h]->SetVersionInfo(job, v, full.dump()));
    for (std::size_t h : holders) TP_RETURN_IF_ERROR(clients_[h]->Commit(job, v));
    return Status::Ok();
  }
  void Drop(const std::string& job, uint64_t v) override {
    for (const auto& c : clients_) (void)c->Abort(job, v);  // best effort; NotFound where never begun
  }
  Result<Moved> Transform(const std::string& job, const ParallelConfig& to) override {
    transform::ClusterTransformOptions opts;
    opts.to = cluster_;  // the live hosts (all of them unless some were killed)
    TP_ASSIGN_OR_RETURN(transform::ClusterTransformStats ts,
                        transform::TransformCluster(from_cluster_, job, to, co_, opts));
    from_cluster_ = cluster_;
    Moved m{ts.to_version, 0, ts.plan.bytes_total, ts.plan.bytes_in_place};
    for (const transform::HostTransformReport& h : ts.hosts) m.bytes_moved += h.bytes_kept + h.bytes_local + h.bytes_fetched;
    return m;
  }
  Status CheckHosts(const std::vector<int>& hosts) const override {
    for (int h : hosts) {
      if (h < 0 || h >= static_cast<int>(file_hosts_.size())) {
        return InvalidArgument("kill host " + std::to_string(h) + " is not a host of the cluster file (" +
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
    std::vector<std::string> killed;
    for (int h : hosts) {
      const std::string& url = file_hosts_[h];
      auto it = std::find(cluster_.hosts.begin(), cluster_.hosts.end(), url);
      if (it == cluster_.hosts.end()) return FailedPrecondition("host " + url + " was already lost");
      const std::size_t at = static_cast<std::size_t>(it - cluster_.hosts.begin());
      const int64_t pid = clients_[at]->pid();
      if (pid <= 0) return FailedPrecondition("the store daemon at " + url + " does not say its process id");
      if (::kill(static_cast<pid_t>(pid), SIGKILL) != 0) return ErrnoError("kill the store daemon at " + url, errno);
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
  transform::Cluster cluster_;       // the live hosts
  transform::Cluster from_cluster_;  // where the committed version was placed (incl. lost hosts)
  std::vector<std::string> file_hosts_;
  store::ClientOptions co_;
  std::vector<std::unique_ptr<store::Client>> clients_;
  std::string work_;
};

// The hand-off file of a version: every rank's tensors and their shm files.
Result<json> HandoffJson(StateBackend& st, const std::string& job, uint64_t v, const Layout& layout,
                         const json& info) {
  TP_ASSIGN_OR_RETURN(auto files, st.Files(job, v, layout));
  json j = info;
  json ranks = json::array();
  for (const RankLayout& r : layout.ranks) {
    json ts = json::array();
    for (const LocalTensor& t : *r.tensors) {
      auto it = files[r.rank].find(t.name);
      if (it == files[r.rank].end() || it->second.empty()) {
        return DataLoss("version " + std::to_string(v) + " of job " + job + " has no shared-memory file for rank " +
                        std::to_string(r.rank) + " tensor " + t.name);
      }
      ts.push_back({{"name", t.name}, {"dtype", std::string(DTypeName(t.dtype))}, {"shape", t.shape}, {"file", it->second}});
    }
    ranks.push_back({{"rank", r.rank}, {"tensors", std::move(ts)}});
  }
  j["ranks"] = std::move(ranks);
  return j;
}

}  // namespace

Result<std::vector<StepRecord>> ReadStepLog(const std::string& path) {
  TP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::map<int64_t, StepRecord> steps;
  std::size_t start = 0, lineno = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++lineno;
    json j = json::parse(text.substr(start, end - start), nullptr, false);
    start = end + 1;
    if (j.is_discarded() || !j.is_object()) {
      return DataLoss(path + ": line " + std::to_string(lineno) + " is not a JSON object");
    }
    if (!j.contains("step") || j.contains("event")) continue;
    if (!j["step"].is_number_integer() || !j.contains("loss") || !j["loss"].is_number()) {
      return DataLoss(path + ": line " + std::to_string(lineno) + " lacks an integer step or a loss");
    }
    StepRecord r;
    r.step = j["step"].get<int64_t>();
    r.loss = j["loss"].get<double>();
    if (j.contains("config") && j["config"].is_string()) r.config = j["config"].get<std::string>();
    if (j.contains("samples") && j["samples"].is_array()) {
      for (const json& s : j["samples"]) {
        if (s.is_number_integer()) r.samples.push_back(s.get<int64_t>());
      }
    }
    steps[r.step] = std::move(r);
  }
  std::vector<StepRecord> out;
  for (auto& [k, v] : steps) out.push_back(std::move(v));
  return out;
}

Result<RunSummary> Run(const RunOptions& o) {
  const auto t_run = Clock::now();
  if (o.command.empty()) return InvalidArgument("no worker command given (tenplex run ... -- CMD ARGS)");
  std::string model_spec = o.model_path;
  for (std::size_t i = 0; model_spec.empty() && i + 1 < o.command.size(); ++i) {
    if (o.command[i] == "--model") model_spec = o.command[i + 1];
  }
  if (model_spec.empty()) return InvalidArgument("no model: give --model M (or --model in the worker command)");
  TP_ASSIGN_OR_RETURN(Model model, LoadModel(model_spec));
  TP_ASSIGN_OR_RETURN(std::string sched_text, ReadFile(o.schedule_path));
  auto sched = ParseSchedule(sched_text, model, [&](int gpus, const std::string& profile, const std::string& memory) {
    return policy::ChooseForWorkers(model, o.command, gpus, profile, memory);
  });
  if (!sched.ok()) return sched.status().WithContext(o.schedule_path);
  const std::vector<ScheduleEntry>& entries = *sched;
  TP_RETURN_IF_ERROR(store::CheckJobName(o.job));

  std::unique_ptr<StateBackend> st;
  if (o.cluster_path.empty()) {
    TP_ASSIGN_OR_RETURN(st, EmbeddedBackend::Open(o));
  } else {
    if (!o.shm_dir.empty()) return InvalidArgument("give --shm-dir (embedded store) or --cluster, not both");
    TP_ASSIGN_OR_RETURN(st, ClusterBackend::Open(o));
  }
  for (const ScheduleEntry& e : entries) {
    Status s = st->CheckHosts(e.kill_hosts);
    if (!s.ok()) return s.WithContext(o.schedule_path);
  }
  const std::string work = st->work_dir();
  std::error_code ec;
  fs::create_directories(work, ec);
  if (ec) return Internal("cannot create " + work + ": " + ec.message());
  // Start a fresh log.
  TP_RETURN_IF_ERROR(WriteFileAtomic(o.log_path, ""));
  const json model_json = json::parse(ModelToJson(model));

  InterruptGuard interrupt_guard;
  RunSummary summary;
  std::optional<uint64_t> committed;
  int64_t step = 0, samples_consumed = 0;
  std::optional<ReconfigureRecord> pending;  // waiting for its restart time
  std::ptrdiff_t recovering = -1;            // a failure's record, until its step is re-done
  Clock::time_point t_failure;
  std::set<std::size_t> kills_done;
  std::size_t i = 0;
  ParallelConfig cfg = entries[0].config;
  int segment = 0;
  for (;;) {
    const int64_t end = entries[i + 1].step;
    TP_ASSIGN_OR_RETURN(Layout layout, MakeLayout(model, cfg));
    json info = {{"model", model_json}, {"config", cfg.ToString()}, {"step", step}, {"samples_consumed", samples_consumed}};
    const std::string out_json = work + "/state-out-" + std::to_string(segment) + ".json";
    const std::string in_json = work + "/state-in-" + std::to_string(segment) + ".json";
    const std::string commit_prefix = work + "/commit-seg" + std::to_string(segment) + "-step";
    // Where the workers write their state, in order: the periodic commits inside the
    // segment (--commit-every), then its end. Each is a version of its own, opened when
    // the one before is committed (versions are committed in the order they are begun).
    struct Target {
      int64_t step;
      std::string path;
    };
    std::vector<Target> targets;
    if (o.commit_every > 0) {
      for (int64_t s = step + o.commit_every; s < end; s += o.commit_every) {
        targets.push_back({s, commit_prefix + std::to_string(s) + ".json"});
      }
    }
    targets.push_back({end, out_json});
    for (const Target& t : targets) {
      fs::remove(t.path, ec);
      fs::remove(t.path + ".result", ec);
    }
    std::size_t target = 0;
    std::optional<uint64_t> v_open;
    auto open_target = [&]() -> Status {
      json tinfo = info;
      tinfo["step"] = targets[target].step;
      TP_ASSIGN_OR_RETURN(uint64_t v, st->BeginLayout(o.job, layout, tinfo));
      v_open = v;
      TP_ASSIGN_OR_RETURN(json h, HandoffJson(*st, o.job, v, layout, tinfo));
      return WriteFileAtomic(targets[target].path, h.dump());
    };
    if (Status s = open_target(); !s.ok()) {
      if (v_open) st->Drop(o.job, *v_open);
      return s;
    }
    if (committed) {
      Result<json> hin = HandoffJson(*st, o.job, *committed, layout, info);
      Status s = hin.ok() ? WriteFileAtomic(in_json, hin->dump()) : hin.status();
      if (!s.ok()) {
        st->Drop(o.job, *v_open);
        return s;
      }
    }
    TP_ASSIGN_OR_RETURN(int port, FreePort());
    LogTail tail(o.log_path);
    std::vector<Worker> workers;
    const auto t_launch = Clock::now();
    for (int r = 0; r < cfg.world_size(); ++r) {
      std::vector<std::string> argv = o.command;
      for (const std::string& a : {std::string("--config"), cfg.ToString(), std::string("--world-rank"), std::to_string(r),
                                   std::string("--world-size"), std::to_string(cfg.world_size()),
                                   std::string("--master-port"), std::to_string(port), std::string("--start-step"),
                                   std::to_string(step), std::string("--steps"), std::to_string(end - step),
                                   std::string("--log"), o.log_path, std::string("--state-out"), out_json}) {
        argv.push_back(a);
      }
      if (o.commit_every > 0) {
        for (const std::string& a : {std::string("--commit-every"), std::to_string(o.commit_every),
                                     std::string("--commit-prefix"), commit_prefix}) {
          argv.push_back(a);
        }
      }
      if (committed) {
        argv.push_back("--state-in");
        argv.push_back(in_json);
      }
      auto w = Spawn(argv, r, work + "/worker-seg" + std::to_string(segment) + "-rank" + std::to_string(r) + ".log");
      if (!w.ok()) {
        for (Worker& x : workers) ::kill(-x.pid, SIGKILL);
        st->Drop(o.job, *v_open);
        return w.status();
      }
      workers.push_back(*w);
    }
    std::vector<int> to_kill, kill_hosts;
    if (!kills_done.count(i + 1)) {
      to_kill = entries[i + 1].kill_ranks;
      kill_hosts = entries[i + 1].kill_hosts;
      // A lost host takes its workers with it.
      Result<std::vector<int>> on_hosts = st->RanksOnHosts(kill_hosts, cfg.world_size());
      if (!on_hosts.ok()) {
        for (Worker& x : workers) ::kill(-x.pid, SIGKILL);
        for (Worker& x : workers) ::waitpid(x.pid, nullptr, 0);
        st->Drop(o.job, *v_open);
        return on_hosts.status();
      }
      to_kill.insert(to_kill.end(), on_hosts->begin(), on_hosts->end());
      std::sort(to_kill.begin(), to_kill.end());
      to_kill.erase(std::unique(to_kill.begin(), to_kill.end()), to_kill.end());
    }
    std::vector<std::string> lost_hosts;
    bool killed = false, failed = false;
    std::string failure;
    const int64_t seg_start = step;
    int64_t last_step_seen = step - 1;
    auto t_progress = Clock::now(), t_last_step = Clock::now(), t_kill = Clock::now();
    double step_interval = 0.4;  // between the last two step lines (a guess until two are seen)
    std::optional<Clock::time_point> kill_at;
    std::size_t alive = workers.size();
    auto stop_workers = [&] {
      for (Worker& x : workers) {
        if (!x.exited) ::kill(-x.pid, SIGKILL);
      }
      for (Worker& x : workers) {
        if (!x.exited) ::waitpid(x.pid, nullptr, 0);
        x.exited = true;
      }
      alive = 0;
    };
    // Reads the result of the target the workers are writing, when there is one.
    auto read_result = [&](const Target& t) -> Result<std::pair<int64_t, int64_t>> {
      TP_ASSIGN_OR_RETURN(std::string text, ReadFile(t.path + ".result"));
      json res = json::parse(text, nullptr, false);
      if (res.is_discarded() || !res.contains("step") || !res["step"].is_number_integer() ||
          !res.contains("samples_consumed") || !res["samples_consumed"].is_number_integer()) {
        return DataLoss(t.path + ".result is not {\"step\", \"samples_consumed\"}");
      }
      if (res["step"].get<int64_t>() != t.step) {
        return DataLoss("workers wrote their state at step " + std::to_string(res["step"].get<int64_t>()) + " into " +
                        t.path + ", which is for step " + std::to_string(t.step));
      }
      return std::make_pair(t.step, res["samples_consumed"].get<int64_t>());
    };
    while (alive > 0) {
      for (const json& line : tail.Poll()) {
        if (!line.contains("step") || line.contains("event") || !line["step"].is_number_integer()) continue;
        int64_t s = line["step"].get<int64_t>();
        if (s > last_step_seen && last_step_seen >= seg_start) step_interval = Since(t_last_step);
        last_step_seen = std::max(last_step_seen, s);
        t_progress = t_last_step = Clock::now();
        if (pending && s >= step) {
          pending->restart_seconds = Since(t_launch);
          summary.reconfigurations.push_back(*pending);
          json ev = {{"event", "reconfigure"}, {"step", pending->step}, {"from", pending->from}, {"to", pending->to},
                     {"seconds", pending->stop_seconds + pending->transform_seconds + pending->restart_seconds},
                     {"stop_seconds", pending->stop_seconds}, {"transform_seconds", pending->transform_seconds},
                     {"restart_seconds", pending->restart_seconds}, {"bytes_moved", pending->bytes_moved},
                     {"bytes_total", pending->bytes_total}, {"bytes_in_place", pending->bytes_in_place},
                     {"after_failure", pending->after_failure}, {"killed_ranks", pending->killed}};
          if (pending->after_failure) ev["lost_steps"] = pending->lost_steps;
          TP_RETURN_IF_ERROR(AppendLine(o.log_path, ev));
          if (pending->after_failure) recovering = static_cast<std::ptrdiff_t>(summary.reconfigurations.size()) - 1;
          pending.reset();
        }
        if (recovering >= 0 && s >= summary.reconfigurations[recovering].failed_step) {
          // Back where the failure struck: the lost steps are re-done.
          ReconfigureRecord& r = summary.reconfigurations[recovering];
          r.recovered_seconds = Since(t_failure);
          TP_RETURN_IF_ERROR(AppendLine(o.log_path, {{"event", "recovered"},
                                                     {"step", r.failed_step},
                                                     {"seconds", r.recovered_seconds},
                                                     {"lost_steps", r.lost_steps}}));
          recovering = -1;
        }
      }
      // A periodic commit written by every worker: commit its version, open the next.
      if (target + 1 < targets.size() && !failed && fs::exists(targets[target].path + ".result", ec)) {
        Result<std::pair<int64_t, int64_t>> res = read_result(targets[target]);
        Status s = res.status();
        if (s.ok()) {
          json cinfo = info;
          cinfo["step"] = res->first;
          cinfo["samples_consumed"] = res->second;
          s = st->Commit(o.job, *v_open, cinfo);
        }
        if (s.ok()) {
          committed = *v_open;
          v_open.reset();
          step = res->first;
          samples_consumed = res->second;
          ++target;
          s = open_target();
        }
        if (!s.ok()) {
          stop_workers();
          if (v_open) st->Drop(o.job, *v_open);
          return s.WithContext("periodic commit of segment " + cfg.ToString());
        }
        t_progress = Clock::now();
      }
      // Kill during the step before the change: half a step after step end-2 is done
      // (or 200 ms in when the segment has a single step).
      if ((!to_kill.empty() || !kill_hosts.empty()) && !killed && !kill_at && (last_step_seen >= end - 2 || end - 1 == seg_start)) {
        kill_at = end - 1 == seg_start ? Clock::now() + std::chrono::milliseconds(200)
                                       : t_last_step + std::chrono::microseconds(static_cast<int64_t>(step_interval * 5e5));
      }
      if (kill_at && !killed && Clock::now() >= *kill_at) {
        for (int r : to_kill) ::kill(-workers[r].pid, SIGKILL);
        Result<std::vector<std::string>> gone = st->KillHosts(kill_hosts);
        if (!gone.ok()) {
          stop_workers();
          if (v_open) st->Drop(o.job, *v_open);
          return gone.status();
        }
        lost_hosts = *gone;
        killed = true;
        t_kill = Clock::now();
        kills_done.insert(i + 1);
      }
      for (Worker& w : workers) {
        if (w.exited) continue;
        int status = 0;
        pid_t p = ::waitpid(w.pid, &status, WNOHANG);
        if (p == w.pid) {
          w.exited = true;
          w.status = status;
          --alive;
          t_progress = Clock::now();
          bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
          if (!ok && !failed) {
            failed = true;
            if (!killed) {
              failure = "worker rank " + std::to_string(w.rank) + " " +
                        (WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                             : "exited with code " + std::to_string(WEXITSTATUS(status))) +
                        "; its output (" + w.log + ") ends with:\n" + Tail(w.log);
            }
            // The others cannot finish the step without it.
            for (Worker& x : workers) {
              if (!x.exited) ::kill(-x.pid, SIGKILL);
            }
          }
        }
      }
      if (alive > 0 && g_interrupted != 0) {
        stop_workers();
        if (v_open) st->Drop(o.job, *v_open);
        return Aborted("interrupted by signal " + std::to_string(static_cast<int>(g_interrupted)) +
                       ": workers stopped; the store keeps the last committed version" +
                       (committed ? " (" + std::to_string(*committed) + ")" : std::string(" (none)")));
      }
      if (alive > 0 && Since(t_progress) > o.hang_seconds) {
        for (Worker& x : workers) {
          if (!x.exited) ::kill(-x.pid, SIGKILL);
        }
        failed = true;
        failure = "no progress for " + std::to_string(static_cast<int>(o.hang_seconds)) + " s (workers killed)";
      }
      if (alive > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    double stop_seconds = 0;
    if (failed && !killed) {
      if (v_open) st->Drop(o.job, *v_open);
      return Internal("segment " + cfg.ToString() + " from step " + std::to_string(seg_start) + " failed: " + failure);
    }
    if (!failed) {
      if (target + 1 != targets.size()) {
        // The workers exited 0 without writing every periodic commit.
        if (v_open) st->Drop(o.job, *v_open);
        return Internal("workers exited 0 but wrote no " + targets[target].path + ".result");
      }
      if (!fs::exists(out_json + ".result", ec)) {
        st->Drop(o.job, *v_open);
        return Internal("workers exited 0 but rank 0 wrote no " + out_json + ".result");
      }
      Result<std::pair<int64_t, int64_t>> res = read_result(targets.back());
      if (!res.ok()) {
        st->Drop(o.job, *v_open);
        return Internal(res.status().message());
      }
      step = res->first;
      samples_consumed = res->second;
      info["step"] = step;
      info["samples_consumed"] = samples_consumed;
      TP_RETURN_IF_ERROR(st->Commit(o.job, *v_open, info));
      committed = *v_open;
      stop_seconds = Since(t_last_step);
    } else {
      if (v_open) st->Drop(o.job, *v_open);
      stop_seconds = Since(t_kill);
      json ev = {{"event", "failure"}, {"config", cfg.ToString()}, {"killed_ranks", to_kill}, {"lost_hosts", lost_hosts},
                 {"during_step", end - 1}, {"rerun_from", step}, {"segment_start", seg_start}};
      TP_RETURN_IF_ERROR(AppendLine(o.log_path, ev));
    }
    ++i;
    ++segment;
    if (entries[i].stop && !failed) break;
    if (entries[i].stop && failed) --i;  // a failure in the last segment re-runs it
    const ParallelConfig next = entries[i].stop ? cfg : entries[i].config;
    if (next != cfg || failed) {
      const bool replace = !lost_hosts.empty();  // the state on lost hosts is re-placed
      ReconfigureRecord rec;
      rec.step = step;
      rec.from = cfg.ToString();
      rec.to = next.ToString();
      rec.after_failure = failed;
      if (failed) {
        rec.killed = to_kill;
        rec.failed_step = end - 1;
        rec.lost_steps = end - 1 - step;
        t_failure = t_kill;
      }
      rec.stop_seconds = stop_seconds;
      if (committed && (next != cfg || replace)) {
        auto t0 = Clock::now();
        auto ts = st->Transform(o.job, next);
        if (!ts.ok()) return ts.status().WithContext("transform " + cfg.ToString() + " -> " + next.ToString());
        committed = ts->version;
        rec.transform_seconds = Since(t0);
        rec.bytes_moved = ts->bytes_moved;
        rec.bytes_total = ts->bytes_total;
        rec.bytes_in_place = ts->bytes_in_place;
      }
      pending = rec;
    }
    cfg = next;
  }
  if (pending) summary.reconfigurations.push_back(*pending);
  TP_ASSIGN_OR_RETURN(summary.steps, ReadStepLog(o.log_path));
  if (!o.baseline_log.empty()) {
    TP_ASSIGN_OR_RETURN(std::vector<StepRecord> base, ReadStepLog(o.baseline_log));
    std::map<int64_t, const StepRecord*> by_step;
    for (const StepRecord& b : base) by_step[b.step] = &b;
    double dev = 0;
    int64_t mismatches = 0;
    for (const StepRecord& s : summary.steps) {
      auto it = by_step.find(s.step);
      if (it == by_step.end()) {
        ++mismatches;
        continue;
      }
      dev = std::max(dev, std::abs(s.loss - it->second->loss) / std::max(1e-12, std::abs(it->second->loss)));
      if (s.samples != it->second->samples) ++mismatches;
    }
    summary.max_loss_deviation = dev;
    summary.sample_mismatches = mismatches;
  }
  summary.seconds = Since(t_run);
  return summary;
}

std::string SummaryTable(const RunSummary& s) {
  std::string out;
  char line[512];
  out += "step  config                     loss\n";
  std::string last_cfg;
  for (const StepRecord& r : s.steps) {
    std::snprintf(line, sizeof(line), "%4lld  %-24s %9.5f%s\n", static_cast<long long>(r.step), r.config.c_str(), r.loss,
                  r.config != last_cfg && !last_cfg.empty() ? "   <- reconfigured" : "");
    out += line;
    last_cfg = r.config;
  }
  if (!s.reconfigurations.empty()) {
    out += "\nreconfigurations (seconds: stop + transform + restart to first step done)\n";
    out += " step  from -> to                                         stop  transform  restart      moved      total  note\n";
    for (const ReconfigureRecord& r : s.reconfigurations) {
      std::string note = r.after_failure ? "after killing rank(s)" : "";
      for (std::size_t k = 0; k < r.killed.size(); ++k) note += (k ? "," : " ") + std::to_string(r.killed[k]);
      if (r.after_failure && r.recovered_seconds > 0) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "; %lld lost step(s), step %lld done again %.2f s after the kill",
                      static_cast<long long>(r.lost_steps), static_cast<long long>(r.failed_step), r.recovered_seconds);
        note += buf;
      }
      std::snprintf(line, sizeof(line), "%5lld  %-22s -> %-22s %6.2f %9.3f %8.2f %10s %10s  %s\n",
                    static_cast<long long>(r.step), r.from.c_str(), r.to.c_str(), r.stop_seconds, r.transform_seconds,
                    r.restart_seconds, HumanBytes(r.bytes_moved).c_str(), HumanBytes(r.bytes_total).c_str(), note.c_str());
      out += line;
    }
  }
  if (s.max_loss_deviation) {
    std::snprintf(line, sizeof(line), "\nlargest loss deviation from the static run: %.3g (relative); steps with other samples: %lld\n",
                  *s.max_loss_deviation, static_cast<long long>(*s.sample_mismatches));
    out += line;
  }
  std::snprintf(line, sizeof(line), "total %.1f s\n", s.seconds);
  out += line;
  return out;
}

}  // namespace tenplex::runtime
