#include "tenplex/sim/traffic.h"

#include <set>
#include <utility>

#include "tenplex/transform/store_tensors.h"

namespace tenplex::sim {
namespace {

int64_t OpBytes(const plan::CopyOp& op, const Layout& to) {
  const LocalTensor& t = (*to.ranks[op.dst_rank].tensors)[op.dst_tensor];
  return Volume(op.global) * static_cast<int64_t>(DTypeSize(t.dtype));
}

// The new tensors the agents link instead of copying (transform/store_tensors.h): one
// call over every rank, kept where old and new rank are the same device, which is what
// each host's own call (the same plan, its ranks) returns.
std::set<std::pair<int, int>> Linked(const plan::Plan& plan, const Layout& from, const Layout& to,
                                     const std::vector<int>& from_hosts,
                                     const std::vector<int>& to_hosts, int only_host) {
  if (only_host >= 0)
    return transform::UnchangedTensors(from, to, plan, &from_hosts, &to_hosts, only_host);
  std::set<std::pair<int, int>> out;
  for (const auto& [rank, i] :
       transform::UnchangedTensors(from, to, plan, nullptr, nullptr, /*host=*/0)) {
    if (from_hosts[rank] != plan::kLostHost && from_hosts[rank] == to_hosts[rank])
      out.insert({rank, i});
  }
  return out;
}

}  // namespace

std::vector<HostTraffic> CountTraffic(const plan::Plan& plan, const Layout& from, const Layout& to,
                                      const std::vector<int>& from_hosts,
                                      const std::vector<int>& to_hosts, int num_hosts,
                                      int only_host) {
  std::vector<HostTraffic> t(num_hosts);
  std::vector<std::set<int>> sources(num_hosts), sinks(num_hosts);
  for (int r = 0; r < from.world_size(); ++r) {
    if (from_hosts[r] >= 0) ++t[from_hosts[r]].old_ranks;
  }
  for (int r = 0; r < to.world_size(); ++r) ++t[to_hosts[r]].new_ranks;
  for (const plan::CopyOp& op : plan.ops) {
    const int dst = to_hosts[op.dst_rank];
    const int64_t bytes = OpBytes(op, to);
    if (op.src_new) {
      t[dst].bytes_landed += bytes;
      continue;
    }
    const int src = from_hosts[op.src_rank];
    if (src == dst) {
      t[dst].bytes_local += bytes;
      continue;
    }
    t[dst].bytes_in += bytes;
    t[src].bytes_out += bytes;
    ++t[dst].remote_ops;
    sources[dst].insert(src);
    sinks[src].insert(dst);
  }
  const std::set<std::pair<int, int>> linked =
      Linked(plan, from, to, from_hosts, to_hosts, only_host);
  for (const plan::CopyOp& k : plan.kept) {
    if (!linked.count({k.dst_rank, k.dst_tensor}))
      t[to_hosts[k.dst_rank]].bytes_kept += OpBytes(k, to);
  }
  for (const RankLayout& r : to.ranks) {
    const int h = to_hosts[r.rank];
    for (std::size_t i = 0; i < r.tensors->size(); ++i) {
      const int64_t b = (*r.tensors)[i].bytes();
      (linked.count({r.rank, static_cast<int>(i)}) ? t[h].bytes_linked : t[h].bytes_new) += b;
    }
  }
  for (int h = 0; h < num_hosts; ++h) {
    t[h].sources.assign(sources[h].begin(), sources[h].end());
    t[h].peers_in = static_cast<int>(sources[h].size());
    t[h].peers_out = static_cast<int>(sinks[h].size());
  }
  return t;
}

}  // namespace tenplex::sim
