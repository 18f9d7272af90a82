// tenplex store serve | load | save: the tensor store daemon and checkpoint transfer
// (docs/store.md).
#include "tenplex/store/store.h"

#include <linux/magic.h>
#include <pthread.h>
#include <signal.h>
#include <sys/vfs.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "tenplex/cli/command.h"
#include "tenplex/cluster/agent.h"
#include "tenplex/cluster/checkpoint_transfer.h"
#include "tenplex/cluster/cluster.h"
#include "tenplex/cluster/job_lease.h"
#include "tenplex/store/client.h"
#include "tenplex/store/server.h"
#include "tenplex/transport/netif.h"
#include "tenplex/util/format.h"
#include "tenplex/util/log.h"

namespace tenplex::cli {

namespace {

using store::Client;
using store::ClientOptions;

struct ServeOpts {
  std::string listen = "127.0.0.1:7480", memory_limit, shm_dir, max_body = "1G", transport = "ucx";
  std::string access_log;
  std::string page_pool;    // --page-pool-bytes; empty: a quarter of the memory limit
  bool presize = false;     // --page-pool-presize
  std::string data_listen;  // UCX devices; empty: the interface of --listen
  TokenOptions token;
  bool no_local_reads = false;
  bool allow_disk = false;  // --allow-disk: a store directory off memory file systems
};

}  // namespace

// The file system holding `dir` (or its nearest existing parent, for a --shm-dir the
// store is to create): its name, and whether its files live in memory.
struct FileSystem {
  std::string name;
  bool memory = false;
};

Result<FileSystem> FileSystemOf(const std::string& dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(dir, ec);
  if (ec) return InvalidArgument("directory '" + dir + "': " + ec.message());
  struct statfs st {};
  while (::statfs(p.c_str(), &st) != 0) {
    const int err = errno;
    if (err != ENOENT || p == p.parent_path()) return ErrnoError("statfs " + p.string(), err);
    p = p.parent_path();
  }
  struct Known {
    unsigned long magic;
    const char* name;
    bool memory;
  };
  static constexpr Known kKnown[] = {{TMPFS_MAGIC, "tmpfs", true},
                                     {RAMFS_MAGIC, "ramfs", true},
                                     {HUGETLBFS_MAGIC, "hugetlbfs", true},
                                     {EXT4_SUPER_MAGIC, "ext2/3/4", false},
                                     {XFS_SUPER_MAGIC, "xfs", false},
                                     {BTRFS_SUPER_MAGIC, "btrfs", false},
                                     {OVERLAYFS_SUPER_MAGIC, "overlay", false},
                                     {NFS_SUPER_MAGIC, "nfs", false}};
  const auto type = static_cast<unsigned long>(st.f_type);
  for (const Known& k : kKnown) {
    if (k.magic == type) return FileSystem{k.name, k.memory};
  }
  char hex[32];
  std::snprintf(hex, sizeof(hex), "file system type 0x%lx", type);
  return FileSystem{hex, false};
}

// The store's tensors belong in memory: a directory on a disk file system (a typo in
// --shm-dir, say) is refused unless --allow-disk (issue 34 finding 5). Returns the file
// system's name for the start line.
Result<std::string> CheckStoreFileSystem(const std::string& dir, const std::string& what,
                                         bool allow_disk) {
  TP_ASSIGN_OR_RETURN(FileSystem fs, FileSystemOf(dir));
  if (fs.memory) return fs.name;
  if (!allow_disk) {
    return InvalidArgument(what + " " + dir + " is on " + fs.name +
                           ", not a memory file system (tmpfs, ramfs, hugetlbfs): the store's "
                           "tensors would live on disk. Give a directory under /dev/shm (or "
                           "another tmpfs), or --allow-disk to keep the store there");
  }
  return fs.name + ": on disk by --allow-disk";
}

namespace {

// The network devices of the UCX data plane: --data-listen ("all": every one), else
// UCX_NET_DEVICES from the environment, else the interface holding the --listen
// address (so `--listen 127.0.0.1:P` keeps the data plane on loopback too). Returns ""
// for "every device" and a description for the startup line.
Result<std::pair<std::string, std::string>> DataPlaneDevices(const ServeOpts& o,
                                                             const std::string& http_host) {
  if (o.data_listen == "all") return std::make_pair(std::string(), std::string("all interfaces"));
  if (!o.data_listen.empty()) return std::make_pair(o.data_listen, "devices " + o.data_listen);
  if (const char* env = std::getenv("UCX_NET_DEVICES"); env != nullptr && *env != '\0')
    return std::make_pair(std::string(), std::string("UCX_NET_DEVICES=") + env);
  Result<std::string> dev = transport::InterfaceOfAddress(http_host);
  if (!dev.ok()) {
    return dev.status().WithContext("--listen " + o.listen +
                                    " (the data plane binds to the same interface; "
                                    "--data-listen chooses another)");
  }
  if (dev->empty()) return std::make_pair(std::string(), std::string("all interfaces"));
  return std::make_pair(*dev, "interface " + *dev);
}

Result<store::StoreOptions> StoreOptionsOf(const ServeOpts& o) {
  store::StoreOptions so;
  so.shm_dir = o.shm_dir;
  if (!o.memory_limit.empty()) {
    TP_ASSIGN_OR_RETURN(so.memory_limit, store::ParseByteSize(o.memory_limit));
  }
  if (!o.page_pool.empty()) {
    Result<uint64_t> pool = store::ParseByteSize(o.page_pool);
    if (!pool.ok()) return pool.status().WithContext("--page-pool-bytes");
    so.page_pool_bytes = *pool;
  }
  so.presize_pool = o.presize;
  return so;
}

// Opens the store after checking its directory's file system (named in *fs_name).
Result<std::unique_ptr<store::Store>> OpenStore(const ServeOpts& o, const store::StoreOptions& so,
                                                std::string* fs_name) {
  if (!o.shm_dir.empty()) {
    TP_ASSIGN_OR_RETURN(*fs_name, CheckStoreFileSystem(o.shm_dir, "--shm-dir", o.allow_disk));
  }
  TP_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> st, store::Store::Open(so));
  if (o.shm_dir.empty()) {  // the private directory: in /dev/shm, or the temp directory
    TP_ASSIGN_OR_RETURN(*fs_name,
                        CheckStoreFileSystem(st->shm_dir(), "the store directory", o.allow_disk));
  }
  return st;
}

Status Serve(const ServeOpts& o) {
  TP_ASSIGN_OR_RETURN(store::HostPort hp, store::ParseHostPort(o.listen));
  TP_ASSIGN_OR_RETURN(store::StoreOptions so, StoreOptionsOf(o));
  store::ServerOptions sv;
  TP_ASSIGN_OR_RETURN(sv.token, ResolveToken(o.token));
  sv.access_log = o.access_log;
  TP_ASSIGN_OR_RETURN(sv.max_body_bytes, store::ParseByteSize(o.max_body));
  if (!store::IsLoopbackHost(hp.host) && sv.token.empty()) {
    return InvalidArgument(
        "--listen " + o.listen +
        " is not a loopback address: it requires a token (--token-file or TENPLEX_TOKEN)");
  }
  // SIGINT/SIGTERM are taken by a thread of ours (sigwait); every other thread,
  // including the server's workers created later, inherits the blocked mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that goes away mid-reply is an error, not a crash
  std::string fs_name;
  TP_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> st, OpenStore(o, so, &fs_name));
  store::Server server(*st, sv);
  // The transform agent: a data-plane endpoint serving this store's tensors to peer
  // daemons, and the /v1/transform/ endpoints (docs/transform.md).
  std::unique_ptr<cluster::Agent> agent;
  std::string data_plane = "none";
  if (o.transport != "none") {
    cluster::AgentOptions ao;
    ao.transport = o.transport;
    TP_ASSIGN_OR_RETURN(auto devices, DataPlaneDevices(o, hp.host));
    ao.transport_options.ucx_net_devices = devices.first;
    data_plane = "UCX on " + devices.second;
    ao.capability_key = sv.token;
    ao.peer_token = sv.token;
    ao.local_peer_reads = !o.no_local_reads;
    if (const char* fault = std::getenv("TENPLEX_FAULT")) ao.fault = fault;
    TP_ASSIGN_OR_RETURN(agent, cluster::Agent::Create(*st, ao));
    agent->Install(server);
  }
  TP_ASSIGN_OR_RETURN(int port, server.Bind(hp.host, hp.port));
  const std::string host = hp.host.find(':') != std::string::npos ? "[" + hp.host + "]" : hp.host;
  std::printf("tenplex store: serving http://%s:%d (shm %s, %s, memory limit %s, data plane %s)\n",
              host.c_str(), port, st->shm_dir().c_str(), fs_name.c_str(),
              HumanBytes(static_cast<int64_t>(st->memory_limit())).c_str(), data_plane.c_str());
  std::fflush(stdout);
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    timespec tick{0, 200 * 1000 * 1000};
    while (!done) {
      int sig = sigtimedwait(&sigs, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM) {
        std::fprintf(stderr, "tenplex store: signal %d, stopping\n", sig);
        server.Stop();
        return;
      }
    }
  });
  Status s = server.Serve();
  done = true;
  waiter.join();
  return s;
}

Result<std::unique_ptr<Client>> ConnectFor(const std::string& url, const TokenOptions& token,
                                           bool http_only) {
  ClientOptions co;
  TP_ASSIGN_OR_RETURN(co.token, ResolveToken(token));
  co.use_shm = !http_only;
  return Client::Connect(url, co);
}

std::string Describe(const cluster::TransferStats& s) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%zu tensors (%s) of %d ranks via %s in %.2f s (%.2f GB/s)",
                s.tensors, HumanBytes(static_cast<int64_t>(s.bytes)).c_str(), s.ranks,
                s.shm ? "shared memory" : "HTTP", s.seconds,
                s.seconds > 0 ? static_cast<double>(s.bytes) / s.seconds / 1e9 : 0.0);
  return buf;
}

// --json: the statistics as JSON; -q: nothing. Returns true when it printed (or
// should stay silent) so that the caller skips its sentence.
bool PrintTransfer(const cluster::TransferStats& s, const std::string& job, bool json) {
  if (json) {
    nlohmann::json j = {{"job", job},
                        {"version", s.version},
                        {"tensors", s.tensors},
                        {"bytes", s.bytes},
                        {"ranks", s.ranks},
                        {"hosts", s.hosts},
                        {"lost_hosts", s.lost_hosts},
                        {"rebuilt_ranks", s.rebuilt_ranks},
                        {"seconds", s.seconds},
                        {"shm", s.shm},
                        {"verified", s.verified}};
    std::printf("%s\n", j.dump().c_str());
    return true;
  }
  return GetLogLevel() == LogLevel::kQuiet;
}

// `store load|save --cluster`: a checkpoint across the store daemons of a cluster file
// (cluster/cluster.h, docs/transform.md); exactly one of --cluster and --url.
Status ClusterTransfer(bool load, const std::string& cluster_path, const std::string& url,
                       const TokenOptions& token, const std::string& job, const std::string& dir,
                       bool json, bool verify = true) {
  if (cluster_path.empty() == url.empty())
    return InvalidArgument("give exactly one of --url and --cluster");
  TP_ASSIGN_OR_RETURN(io::Cluster cluster, io::ReadClusterFile(cluster_path));
  ClientOptions co;
  TP_ASSIGN_OR_RETURN(co.token, ResolveToken(token));
  // A daemon that stops answering (stopped, hung) fails the request after 30 s of
  // silence instead of the default 10 minutes.
  co.timeout_s = 30;
  co.coordinator = cluster::NewCoordinator(load ? "tenplex-store-load" : "tenplex-store-save");
  TP_ASSIGN_OR_RETURN(double wait, cluster::LeaseWaitFromEnv(60));
  TP_ASSIGN_OR_RETURN(auto clients, cluster::ConnectCluster(cluster, co, /*allow_lost=*/!load));
  // One coordinator of the job at a time (cluster/job_lease.h): a load's recovery and
  // commit, and a save's roll-forward, never run beside another coordinator's.
  std::vector<store::Client*> raw;
  for (const auto& c : clients) raw.push_back(c.get());
  TP_ASSIGN_OR_RETURN(auto lease,
                      cluster::JobLease::Acquire(raw, job, co, {store::kDefaultLeaseMs, wait}));
  Progress progress(load ? "store load" : "store save");
  Result<cluster::TransferStats> r =
      load ? cluster::LoadCheckpointToCluster(cluster, clients, job, dir, verify)
           : cluster::SaveCheckpointFromCluster(cluster, clients, job, dir);
  progress.Done();
  if (!r.ok()) return r.status();
  const cluster::TransferStats& s = *r;
  if (PrintTransfer(s, job, json)) return Status::Ok();
  if (load) {
    std::printf(
        "loaded %zu tensors (%s) of %d ranks onto %zu hosts as jobs/%s/%llu (committed on all) in "
        "%.2f s\n",
        s.tensors, HumanBytes(static_cast<int64_t>(s.bytes)).c_str(), s.ranks, s.hosts.size(),
        job.c_str(), static_cast<unsigned long long>(s.version), s.seconds);
    return Status::Ok();
  }
  std::string lost;
  if (!s.lost_hosts.empty()) {
    lost = "; lost hosts:";
    for (const std::string& u : s.lost_hosts) lost += " " + u;
  }
  if (s.rebuilt_ranks > 0)
    lost += "; " + std::to_string(s.rebuilt_ranks) + " ranks rebuilt from replicas";
  std::printf("saved jobs/%s/%llu from %zu hosts to %s: %zu tensors (%s) of %d ranks in %.2f s%s\n",
              job.c_str(), static_cast<unsigned long long>(s.version), s.hosts.size(), dir.c_str(),
              s.tensors, HumanBytes(static_cast<int64_t>(s.bytes)).c_str(), s.ranks, s.seconds,
              lost.c_str());
  return Status::Ok();
}

// store serve: the daemon in the foreground.
void AddServe(CLI::App* cmd, Context& ctx) {
  auto* serve =
      cmd->add_subcommand("serve", "Run a store daemon in the foreground (SIGTERM/SIGINT stop it)");
  auto so = std::make_shared<ServeOpts>();
  serve->add_option("--listen", so->listen, "host:port to listen on (port 0: any free port)")
      ->capture_default_str();
  AddTokenOptions(serve, &so->token);
  serve->add_option("--memory-limit", so->memory_limit,
                    "Bytes of tensors the store may hold (e.g. 8G; default: free shared memory)");
  serve->add_option("--page-pool-bytes", so->page_pool,
                    "Bytes of released versions' shared memory kept for the job's next tensors "
                    "(e.g. 4G; 0: off; default: a quarter of the memory limit)");
  serve->add_flag("--page-pool-presize", so->presize,
                  "After each commit, fill the job's page pool in the background with files of "
                  "the committed version's sizes, so that its next version writes into warm pages");
  serve->add_option("--shm-dir", so->shm_dir,
                    "Shared-memory directory, on tmpfs, ramfs or hugetlbfs; kept across "
                    "restarts (default: a fresh private one in /dev/shm)");
  serve->add_flag("--allow-disk", so->allow_disk,
                  "Allow a store directory on a disk file system (tensors in files on disk)");
  serve->add_option("--max-body", so->max_body, "Largest request body (e.g. 1G)")
      ->capture_default_str();
  serve->add_option("--access-log", so->access_log,
                    "One line per request (time client method target status bytes-in bytes-out "
                    "seconds): - for stderr, or a file appended to");
  serve
      ->add_option("--transport", so->transport,
                   "Data plane to peer daemons: ucx or none (no transform agent)")
      ->check(CLI::IsMember({"ucx", "none"}))
      ->capture_default_str();
  serve->add_option("--data-listen", so->data_listen,
                    "Network devices of the UCX data plane (UCX_NET_DEVICES syntax, e.g. eth0 or "
                    "mlx5_0:1,eth0; all: every one). Default: UCX_NET_DEVICES if set, else the "
                    "interface of the --listen address");
  serve->add_flag("--no-local-peer-reads", so->no_local_reads,
                  "Neither offer nor use same-host reads of committed tensors through the "
                  "shared-memory files of daemons on this machine: the data plane only "
                  "(docs/transport.md)");
  serve->callback([so, &ctx] { Finish(ctx, Serve(*so)); });
}

// The options of store load and store save.
struct XferOpts {
  std::string url, job, dir, cluster;
  TokenOptions token;
  bool http = false, json = false, no_verify = false;
};

// store load: a checkpoint directory into a new committed version.
void AddLoad(CLI::App* cmd, Context& ctx) {
  auto lo = std::make_shared<XferOpts>();
  auto* load = cmd->add_subcommand(
      "load", "Load a checkpoint directory as a new committed version of a job");
  load->add_option("--url", lo->url, "Store URL, e.g. http://127.0.0.1:7480");
  load->add_option("--cluster", lo->cluster,
                   "Cluster file (docs/transform.md): each rank to its host");
  load->add_option("--job", lo->job, "Job name")->required();
  load->add_option("--dir", lo->dir, "Checkpoint directory (spec section 7)")->required();
  AddTokenOptions(load, &lo->token);
  load->add_flag("--http", lo->http, "Send bytes in HTTP bodies even when the store is local");
  load->add_flag("--json", lo->json, "Print the result as JSON");
  load->add_flag("--no-verify", lo->no_verify,
                 "Load even without checksums in tenplex.json (they are required and checked)");
  load->callback([lo, &ctx] {
    if (!lo->cluster.empty() || lo->url.empty()) {
      return Finish(ctx, ClusterTransfer(/*load=*/true, lo->cluster, lo->url, lo->token, lo->job,
                                         lo->dir, lo->json, !lo->no_verify));
    }
    auto c = ConnectFor(lo->url, lo->token, lo->http);
    if (!c.ok()) return Finish(ctx, c.status());
    Progress progress("store load");
    auto s = cluster::LoadCheckpoint(**c, lo->job, lo->dir, !lo->no_verify);
    progress.Done();
    if (!s.ok()) return Finish(ctx, s.status());
    if (PrintTransfer(*s, lo->job, lo->json)) return Finish(ctx, Status::Ok());
    std::printf("loaded %s into jobs/%s/%llu (committed; checksums %s)\n", Describe(*s).c_str(),
                lo->job.c_str(), static_cast<unsigned long long>(s->version),
                s->verified ? "verified" : "not checked (--no-verify)");
    Finish(ctx, Status::Ok());
  });
}

// store save: a job's current version to a checkpoint directory.
void AddSave(CLI::App* cmd, Context& ctx) {
  auto vo = std::make_shared<XferOpts>();
  auto* save =
      cmd->add_subcommand("save", "Write a job's current version as a checkpoint directory");
  save->add_option("--url", vo->url, "Store URL, e.g. http://127.0.0.1:7480");
  save->add_option("--cluster", vo->cluster,
                   "Cluster file (docs/transform.md): ranks from all hosts");
  save->add_option("--job", vo->job, "Job name")->required();
  save->add_option("--out", vo->dir, "Output directory (must not exist or be empty)")->required();
  AddTokenOptions(save, &vo->token);
  save->add_flag("--http", vo->http, "Receive bytes in HTTP bodies even when the store is local");
  save->add_flag("--json", vo->json, "Print the result as JSON");
  save->callback([vo, &ctx] {
    if (!vo->cluster.empty() || vo->url.empty()) {
      return Finish(ctx, ClusterTransfer(/*load=*/false, vo->cluster, vo->url, vo->token, vo->job,
                                         vo->dir, vo->json));
    }
    auto c = ConnectFor(vo->url, vo->token, vo->http);
    if (!c.ok()) return Finish(ctx, c.status());
    Progress progress("store save");
    auto s = cluster::SaveCheckpoint(**c, vo->job, vo->dir);
    progress.Done();
    if (!s.ok()) return Finish(ctx, s.status());
    if (PrintTransfer(*s, vo->job, vo->json)) return Finish(ctx, Status::Ok());
    std::printf("saved jobs/%s/%llu to %s: %s\n", vo->job.c_str(),
                static_cast<unsigned long long>(s->version), vo->dir.c_str(), Describe(*s).c_str());
    Finish(ctx, Status::Ok());
  });
}

}  // namespace

void RegisterStore(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("store",
                                 "Tensor store daemon (shared-memory tensors, versions, HTTP API)");
  cmd->require_subcommand(1);
  AddServe(cmd, ctx);
  AddLoad(cmd, ctx);
  AddSave(cmd, ctx);
  RegisterStoreAdmin(*cmd, ctx);
}

}  // namespace tenplex::cli
