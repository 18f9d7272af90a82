// `tenplex transform --cluster C [--to-cluster C2] --job J --to CONFIG [--presize] [--json]`: the
// distributed state transformation (src/tenplex/cluster/distributed.h).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "tenplex/cli/command.h"
#include "tenplex/cluster/cluster.h"
#include "tenplex/cluster/distributed.h"
#include "tenplex/cluster/job_lease.h"
#include "tenplex/cluster/two_phase.h"
#include "tenplex/util/format.h"
#include "tenplex/util/log.h"

namespace tenplex::cli {

namespace {

Result<store::ClientOptions> ClusterClientOptions(const TokenOptions& token) {
  store::ClientOptions co;
  TP_ASSIGN_OR_RETURN(co.token, ResolveToken(token));
  return co;
}

struct TransformOpts {
  std::string cluster, to_cluster, job, to;
  TokenOptions token;
  int attempts = 3, control_timeout = 10, silent_timeout = 10, prepare_timeout = 3600;
  bool central = false, json = false, quiet = false, recover = false, no_local_reads = false;
  bool presize = false;
};

// `tenplex transform --presize`: each host's line (or JSON) of what its pool now holds.
Status PrintPresized(const TransformOpts& o, const cluster::ClusterTransformStats& s) {
  if (o.json) {
    nlohmann::json hosts = nlohmann::json::array();
    for (const cluster::HostPresizeReport& h : s.presized) {
      hosts.push_back({{"url", h.url},
                       {"wanted_bytes", h.wanted_bytes},
                       {"poolable_bytes", h.poolable_bytes},
                       {"pooled_bytes", h.pooled_bytes},
                       {"seconds", h.seconds}});
    }
    nlohmann::json j = {
        {"from_version", s.from_version}, {"from", s.from_config}, {"to", s.to_config},
        {"new_hosts", s.new_hosts},       {"seconds", s.seconds},  {"presized", hosts}};
    std::printf("%s\n", j.dump(2).c_str());
    return Status::Ok();
  }
  for (const cluster::HostPresizeReport& h : s.presized) {
    std::printf(
        "%s: pool %s for the %s this transform allocates there (%s in files large enough "
        "to pool) (%.2f s)\n",
        h.url.c_str(), HumanBytes(h.pooled_bytes).c_str(), HumanBytes(h.wanted_bytes).c_str(),
        HumanBytes(h.poolable_bytes).c_str(), h.seconds);
  }
  std::printf("pre-sized version %llu (%s) -> %s on %zu hosts in %.2f s\n",
              static_cast<unsigned long long>(s.from_version), s.from_config.c_str(),
              s.to_config.c_str(), s.presized.size(), s.seconds);
  return Status::Ok();
}

// `tenplex transform --recover`: finish or roll back what a crash left half done.
Status Recover(const TransformOpts& o, const io::Cluster& cluster) {
  TP_ASSIGN_OR_RETURN(store::ClientOptions co, ClusterClientOptions(o.token));
  co.timeout_s = o.control_timeout;
  co.coordinator = cluster::NewCoordinator("tenplex-transform-recover");
  TP_ASSIGN_OR_RETURN(double wait, cluster::LeaseWaitFromEnv(60));
  TP_ASSIGN_OR_RETURN(auto clients, cluster::ConnectCluster(cluster, co, /*allow_lost=*/true));
  std::vector<store::Client*> raw;
  for (const auto& c : clients) raw.push_back(c.get());
  // Never decide beside a live coordinator of the job (job_lease.h).
  TP_ASSIGN_OR_RETURN(auto lease,
                      cluster::JobLease::Acquire(raw, o.job, co, {store::kDefaultLeaseMs, wait}));
  TP_ASSIGN_OR_RETURN(cluster::Resolution r,
                      cluster::ResolvePending(cluster.hosts, raw, o.job, /*owner=*/true));
  if (o.json) {
    nlohmann::json j = {{"job", o.job},         {"committed", r.committed}, {"aborted", r.aborted},
                        {"pending", r.pending}, {"released", r.released},   {"lines", r.lines}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    for (const std::string& line : r.lines) std::printf("%s\n", line.c_str());
    std::printf("job %s: %zu version(s) rolled forward, %zu rolled back, %zu undecided\n",
                o.job.c_str(), r.committed.size(), r.aborted.size(), r.pending.size());
  }
  if (!r.pending.empty())
    return Unavailable("some prepared versions are undecided: a participant does not answer");
  return Status::Ok();
}

// The participants of the last round as `--json` lists them ("hosts"): each one's
// prepare reply's bytes and phases.
nlohmann::json HostsJson(const cluster::ClusterTransformStats& s) {
  nlohmann::json hosts = nlohmann::json::array();
  for (const cluster::HostTransformReport& h : s.hosts) {
    const cluster::PrepareReply& p = h.prepare;
    hosts.push_back({{"url", h.url},
                     {"ranks", h.ranks},
                     {"bytes_kept", p.bytes_kept},
                     {"bytes_linked", p.bytes_linked},
                     {"bytes_local", p.bytes_local},
                     {"bytes_fetched", p.bytes_fetched},
                     {"bytes_fetched_shm", p.bytes_fetched_shm},
                     {"seconds", p.seconds},
                     {"plan_seconds", p.plan_seconds},
                     {"warm_seconds", p.warm_seconds},
                     {"alloc_seconds", p.alloc_seconds},
                     {"local_seconds", p.local_seconds},
                     {"fetch_seconds", p.fetch_seconds},
                     {"seal_seconds", p.seal_seconds}});
  }
  return hosts;
}

Status Transform(const TransformOpts& o) {
  TP_ASSIGN_OR_RETURN(io::Cluster cluster, io::ReadClusterFile(o.cluster));
  if (o.presize && (o.central || o.recover))
    return InvalidArgument(
        "--presize is for the distributed transform: not with --central or --recover");
  if (o.recover) return Recover(o, cluster);
  if (o.to.empty()) return InvalidArgument("--to is required (unless --recover)");
  cluster::ClusterTransformOptions opts;
  opts.control_timeout_s = o.control_timeout;
  opts.silent_s = o.silent_timeout;
  opts.prepare_timeout_s = o.prepare_timeout;
  if (!o.to_cluster.empty()) {
    TP_ASSIGN_OR_RETURN(opts.to, io::ReadClusterFile(o.to_cluster));
  }
  Result<ParallelConfig> to = ParseConfig(o.to);
  if (!to.ok()) return to.status().WithContext("--to");
  opts.max_attempts = o.attempts;
  opts.central = o.central;
  opts.local_peer_reads = !o.no_local_reads;
  opts.presize_only = o.presize;
  TP_ASSIGN_OR_RETURN(opts.lease_wait_s, cluster::LeaseWaitFromEnv(opts.lease_wait_s));
  TP_ASSIGN_OR_RETURN(store::ClientOptions co, ClusterClientOptions(o.token));
  // Run on behalf of a coordinator that holds the job's lease (the rank 0 of a torchrun
  // job, tenplex.elastic): its name, and no lease of our own (job_lease.h).
  if (const char* c = std::getenv("TENPLEX_COORDINATOR"); c != nullptr && *c != '\0') {
    TP_RETURN_IF_ERROR(store::JobLeases::CheckHolder(c));
    co.coordinator = c;
    opts.lease_held = true;
  }
  if (!o.quiet && GetLogLevel() != LogLevel::kQuiet)
    opts.log = [](const std::string& line) {
      std::fprintf(stderr, "tenplex transform: %s\n", line.c_str());
    };
  // Bytes of the new version, as each host's prepare reports them done.
  std::optional<Progress> progress;
  if (!o.quiet) progress.emplace("transform");
  Result<cluster::ClusterTransformStats> r =
      cluster::TransformCluster(cluster, o.job, *to, co, opts);
  if (progress) progress->Done();
  if (!r.ok()) return r.status();
  const cluster::ClusterTransformStats& s = *r;
  if (o.presize) return PrintPresized(o, s);
  if (!o.json) {
    std::printf("%s\n", cluster::ClusterTransformSummary(s).c_str());
    return Status::Ok();
  }
  nlohmann::json j = {{"from_version", s.from_version},
                      {"to_version", s.to_version},
                      {"from", s.from_config},
                      {"to", s.to_config},
                      {"attempts", s.attempts},
                      {"lost_hosts", s.lost_hosts},
                      {"unconfirmed_hosts", s.unconfirmed_hosts},
                      {"recovered", s.recovered},
                      {"new_hosts", s.new_hosts},
                      {"central", o.central},
                      {"seconds", s.seconds},
                      {"plan_seconds", s.plan_seconds},
                      {"prepare_seconds", s.prepare_seconds},
                      {"commit_seconds", s.commit_seconds},
                      {"round_seconds", s.round_seconds},
                      {"plan",
                       {{"bytes_total", s.plan.bytes_total},
                        {"bytes_in_place", s.plan.bytes_in_place},
                        {"bytes_host_local", s.plan.bytes_host_local},
                        {"bytes_cross_host", s.plan.bytes_cross_host},
                        {"cross_host_lower_bound", s.plan.cross_host_lower_bound},
                        {"max_host_recv_bytes", s.plan.max_host_recv_bytes},
                        {"max_host_send_bytes", s.plan.max_host_send_bytes},
                        {"hosts", s.all_hosts},
                        {"host_send_bytes", s.plan.host_send_bytes},
                        {"host_recv_bytes", s.plan.host_recv_bytes}}},
                      {"hosts", HostsJson(s)}};
  std::printf("%s\n", j.dump(2).c_str());
  return Status::Ok();
}

}  // namespace

void RegisterTransform(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "transform",
      "Transform a job's state across the store daemons of a cluster to a new parallel config");
  auto o = std::make_shared<TransformOpts>();
  cmd->add_option("--cluster", o->cluster,
                  "Cluster file of the hosts holding the state (docs/transform.md)")
      ->required();
  cmd->add_option("--to-cluster", o->to_cluster,
                  "Place the new layout on these hosts instead (redeployment)");
  cmd->add_option("--job", o->job, "Job name")->required();
  cmd->add_option("--to", o->to, "New parallel config, e.g. tp=2,pp=2,dp=2,zero=1");
  cmd->add_flag("--recover", o->recover,
                "Only finish or roll back a transform or load a crash left half done "
                "(docs/reliability.md)");
  cmd->add_option("--control-timeout", o->control_timeout,
                  "Seconds each control request to a daemon may take")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--silent-timeout", o->silent_timeout,
                  "Seconds a participant may not answer during its prepare before it is lost")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--prepare-timeout", o->prepare_timeout, "Seconds the whole prepare may take")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  AddTokenOptions(cmd, &o->token);
  cmd->add_option("--attempts", o->attempts, "Attempts when hosts are lost mid-transform")
      ->capture_default_str();
  cmd->add_flag("--central", o->central,
                "Baseline for benchmarks: gather all state on one host, re-slice there, scatter");
  cmd->add_flag("--no-local-peer-reads", o->no_local_reads,
                "Move every cross-host byte over the data plane (UCX), also between daemons of "
                "one machine that could read each other's shared memory (docs/transport.md)");
  cmd->add_flag("--presize", o->presize,
                "Only pre-size: every host with new ranks makes its new tensors of this "
                "transform ahead in its page pool (run it while the old config trains); "
                "nothing is written or committed");
  cmd->add_flag("--json", o->json, "Print the statistics as JSON");
  cmd->add_flag("--quiet", o->quiet, "No progress lines on stderr (also -q)");
  cmd->callback([o, &ctx] { Finish(ctx, Transform(*o)); });
}

}  // namespace tenplex::cli
