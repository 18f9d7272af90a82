#include "tenplex/transform/host_exec.h"

#include <chrono>
#include <map>
#include <thread>

#include "tenplex/geometry/copy.h"
#include "tenplex/transform/executor.h"
#include "tenplex/transport/box_reads.h"

namespace tenplex::transform {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t OpBytes(const plan::Plan& p, const Layout& from, const plan::CopyOp& op) {
  return Volume(op.global) *
         static_cast<int64_t>(DTypeSize(from.globals.at(p.tensors[op.tensor]).dtype));
}

// A plan with the same tensors and only the given ops (the executor runs them in order).
plan::Plan SubPlan(const plan::Plan& p, std::vector<plan::CopyOp> ops,
                   std::vector<plan::CopyOp> kept) {
  plan::Plan sub;
  sub.tensors = p.tensors;
  sub.ops = std::move(ops);
  sub.kept = std::move(kept);
  return sub;
}

struct PeerReads {
  std::vector<transport::ReadRequest> requests;
  std::map<std::pair<int, int>, std::size_t> index;  // (old rank, tensor) -> request
};

// This host's ops by kind: kept in place, local copies, copies from new tensors (after
// the fetches), and the reads from each peer (by host).
struct HostOps {
  std::vector<plan::CopyOp> kept, local, landed;
  std::map<int, PeerReads> peers;
};

// Adds the reads of remote op `op` (the runs of its box, from the peer's tensor into
// ours) to the reads from its host.
Status AddRemoteReads(const HostExecInput& in, const plan::CopyOp& op, PeerReads& pr) {
  const plan::Plan& p = *in.plan;
  const LocalTensor& st = (*in.from->ranks.at(op.src_rank).tensors).at(op.src_tensor);
  const LocalTensor& dt = (*in.to->ranks.at(op.dst_rank).tensors).at(op.dst_tensor);
  const auto& dst_bufs = in.dst->at(op.dst_rank);
  if (static_cast<std::size_t>(op.dst_tensor) >= dst_bufs.size() ||
      dst_bufs[op.dst_tensor] == nullptr) {
    return InvalidArgument("no destination buffer for rank " + std::to_string(op.dst_rank) +
                           " tensor " + dt.name);
  }
  auto key = std::make_pair(static_cast<int>(op.src_rank), static_cast<int>(op.src_tensor));
  auto it = pr.index.find(key);
  if (it == pr.index.end()) {
    it = pr.index.emplace(key, pr.requests.size()).first;
    pr.requests.push_back({in.region_name(op.src_rank, op.src_tensor), {}});
  }
  Status s =
      transport::AppendBoxReads(st.shape, op.src, 0, {dst_bufs[op.dst_tensor], dt.shape, op.dst},
                                DTypeSize(dt.dtype), &pr.requests[it->second].runs);
  if (!s.ok()) return s.WithContext("reading " + p.tensors[op.tensor] + " " + ToString(op.global));
  return Status::Ok();
}

// The predicates SortOps and SourcesReadHere share: whether an op writes on `host`,
// whether its destination tensor was linked (no copy), whether its source is an old
// rank of `host`.
bool WritesOn(const std::vector<int>& to_hosts, const plan::CopyOp& op, int host) {
  return to_hosts.at(op.dst_rank) == host;
}
bool IntoLinked(const std::set<std::pair<int, int>>* linked, const plan::CopyOp& op) {
  return linked != nullptr && linked->count({op.dst_rank, op.dst_tensor}) > 0;
}
bool ReadsOldOn(const std::vector<int>& from_hosts, const plan::CopyOp& op, int host) {
  return !op.src_new && from_hosts.at(op.src_rank) == host;
}

// Sorts the plan's ops that write on this host by kind, counting their bytes in stats.
Result<HostOps> SortOps(const HostExecInput& in, HostExecStats& stats) {
  const plan::Plan& p = *in.plan;
  const Layout& from = *in.from;
  const auto& fh = *in.from_hosts;
  const auto& th = *in.to_hosts;
  HostOps ops;
  for (const plan::CopyOp& op : p.kept) {
    if (!WritesOn(th, op, in.host)) continue;
    if (IntoLinked(in.linked, op)) {
      stats.bytes_linked += OpBytes(p, from, op);
      continue;
    }
    ops.kept.push_back(op);
    stats.bytes_kept += OpBytes(p, from, op);
  }
  for (const plan::CopyOp& op : p.ops) {
    if (!WritesOn(th, op, in.host)) continue;
    if (op.src_new) {
      ops.landed.push_back(op);
      stats.bytes_local += OpBytes(p, from, op);
      continue;
    }
    if (ReadsOldOn(fh, op, in.host)) {
      ops.local.push_back(op);
      stats.bytes_local += OpBytes(p, from, op);
      continue;
    }
    const int src_host = fh.at(op.src_rank);
    if (src_host == plan::kLostHost) {
      return Internal("the plan reads " + p.tensors[op.tensor] + " from old rank " +
                      std::to_string(op.src_rank) + " on a lost host");
    }
    TP_RETURN_IF_ERROR(AddRemoteReads(in, op, ops.peers[src_host]));
    stats.bytes_fetched += OpBytes(p, from, op);
    ++stats.remote_ops;
  }
  stats.peers = static_cast<int>(ops.peers.size());
  return ops;
}

}  // namespace

std::set<std::pair<int, int>> SourcesReadHere(const plan::Plan& p,
                                              const std::vector<int>& from_hosts,
                                              const std::vector<int>& to_hosts, int host,
                                              const std::set<std::pair<int, int>>* linked) {
  std::set<std::pair<int, int>> out;
  for (const plan::CopyOp& op : p.kept) {
    if (WritesOn(to_hosts, op, host) && ReadsOldOn(from_hosts, op, host) && !IntoLinked(linked, op))
      out.insert({op.src_rank, op.src_tensor});
  }
  for (const plan::CopyOp& op : p.ops) {
    if (WritesOn(to_hosts, op, host) && ReadsOldOn(from_hosts, op, host))
      out.insert({op.src_rank, op.src_tensor});
  }
  return out;
}

Result<HostExecStats> ExecuteHostPart(const HostExecInput& in) {
  const plan::Plan& p = *in.plan;
  const Layout& from = *in.from;
  const Layout& to = *in.to;
  HostExecStats stats;
  TP_ASSIGN_OR_RETURN(HostOps ops, SortOps(in, stats));
  std::map<int, PeerReads>& peers = ops.peers;

  // Fetches from every peer at once, each on its own thread; local copies meanwhile.
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  std::vector<Status> fetched(peers.size());
  std::size_t i = 0;
  for (auto& [peer, pr] : peers) {
    threads.emplace_back(
        [&, peer = peer, slot = i] { fetched[slot] = in.fetch(peer, peers.at(peer).requests); });
    ++i;
  }
  ExecuteOptions opts;
  opts.pool = in.pool;
  opts.zero_padding = false;
  Status local_status = ExecutePlan(SubPlan(p, std::move(ops.local), std::move(ops.kept)), from, to,
                                    *in.src, *in.dst, opts);
  stats.local_seconds = Since(t0);
  for (std::thread& t : threads) t.join();
  stats.fetch_seconds = Since(t0);
  TP_RETURN_IF_ERROR(local_status);
  i = 0;
  for (const auto& [peer, pr] : peers) {
    if (!fetched[i].ok())
      return fetched[i].WithContext("fetching from host " + std::to_string(peer));
    ++i;
  }
  auto t1 = std::chrono::steady_clock::now();
  TP_RETURN_IF_ERROR(
      ExecutePlan(SubPlan(p, std::move(ops.landed), {}), from, to, *in.src, *in.dst, opts));
  stats.landed_seconds = Since(t1);
  return stats;
}

}  // namespace tenplex::transform
