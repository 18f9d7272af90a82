#include "tenplex/plan/planner.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <unordered_map>

#include "tenplex/plan/box_set.h"
#include "tenplex/util/format.h"

namespace tenplex::plan {
namespace {

// True when a (global, local) pair maps a box onto a 1-D range of a flat local tensor
// rather than onto a box of the same extents.
bool IsFlat(const Box& global, const Box& local) {
  if (local.rank() != global.rank()) return true;
  for (std::size_t k = 0; k < global.rank(); ++k) {
    if (local[k].size() != global[k].size()) return true;
  }
  return false;
}

bool Intersects(const Box& a, const Box& b) {
  for (std::size_t k = 0; k < a.rank(); ++k) {
    if (std::max(a[k].begin, b[k].begin) >= std::min(a[k].end, b[k].end)) return false;
  }
  return true;
}

// Row-major offset of part's first element inside the dense extents of `outer`.
int64_t RelOffset(const Box& part, const Box& outer) {
  int64_t off = 0;
  for (std::size_t k = 0; k < outer.rank(); ++k)
    off = off * outer[k].size() + (part[k].begin - outer[k].begin);
  return off;
}

// Where elements live: a global box and its local region in (layout, rank, tensor).
struct Site {
  const Box* global;
  const Box* local;
  int32_t rank;
  int32_t tensor;
  int32_t host;
  bool is_new;
  int64_t after;
  bool flat;
};

Site MakeSite(const Box& global, const Box& local, int32_t rank, int32_t tensor, int32_t host,
              bool is_new, int64_t after) {
  return {&global, &local, rank, tensor, host, is_new, after, IsFlat(global, local)};
}

// The local region of `part` (a sub-box of site.global, contiguous in it when flat).
Box RegionOf(const Box& part, const Site& s) {
  if (!s.flat) return MapBox(part, *s.global, *s.local);
  const int64_t off = (*s.local)[0].begin + RelOffset(part, *s.global);
  return Box({{off, off + Volume(part)}});
}

// Cuts box (inside site.global) into parts that are one region each on the site.
void SplitFor(const Box& box, const Site& s, std::vector<Box>& out) {
  if (!s.flat) {
    out.push_back(box);
    return;
  }
  const Box& g = *s.global;
  Shape ext = g.extents();
  std::vector<int64_t> neg(g.rank());
  for (std::size_t k = 0; k < g.rank(); ++k) neg[k] = -g[k].begin;
  std::vector<int64_t> pos(g.rank());
  for (std::size_t k = 0; k < g.rank(); ++k) pos[k] = g[k].begin;
  for (const Box& p : ContiguousParts(ext, Translate(box, neg))) out.push_back(Translate(p, pos));
}

// Calls fn(part) for the parts of box that are one region on both sites (box itself
// unless a side is flat).
template <typename Fn>
void ForEachPart(Box box, const Site& a, const Site& b, Fn&& fn) {
  if (!a.flat && !b.flat) {
    fn(std::move(box));
    return;
  }
  std::vector<Box> first, out;
  SplitFor(box, a, first);
  for (const Box& p : first) SplitFor(p, b, out);
  for (Box& p : out) fn(std::move(p));
}

struct Holder {
  int32_t rank;
  int32_t host;
  int32_t tensor;
  const Piece* piece;
};

// Old pieces of one global tensor with one global box: the replicas of that box.
struct Group {
  const Box* global;
  std::vector<Holder> holders;  // sorted by (host, rank)
  // Distinct holder hosts (ascending) with each one's first (lowest-rank) holder, and the
  // id of that host set in Planner::host_sets_.
  std::vector<std::pair<int32_t, int32_t>> hosts;
  int32_t host_set = -1;
};

struct Need {
  int32_t host;
  int32_t rank;
  int32_t tensor;
  const Piece* piece;
};

// A box delivered to a host by an earlier op (Plan::ops index): its global box and
// destination are that op's.
struct Landed {
  int64_t op;
};

// One step-4 transfer of a host that is only simulated (per-host planning): `bytes`
// of group `group` from the remote holder the greedy rule picks.
struct Charge {
  int32_t group;
  int64_t bytes;
};

Status CheckGlobals(const std::vector<GlobalTensor>& globals, const Layout& layout,
                    const char* which) {
  if (layout.globals.size() != globals.size()) {
    return InvalidArgument(std::string("the ") + which + " layout has " +
                           std::to_string(layout.globals.size()) +
                           " global tensors but the model has " + std::to_string(globals.size()));
  }
  for (const GlobalTensor& g : globals) {
    auto it = layout.globals.find(g.name);
    if (it == layout.globals.end() || it->second.dtype != g.dtype || it->second.shape != g.shape) {
      return InvalidArgument(std::string("the ") + which +
                             " layout does not match the model at global tensor " + g.name);
    }
  }
  return Status::Ok();
}

class Planner {
 public:
  Planner(const Model& model, const Layout& from, const Layout& to,
          const std::vector<int>& from_hosts, const std::vector<int>& to_hosts, int only_host)
      : model_(model),
        from_(from),
        to_(to),
        from_hosts_(from_hosts),
        to_hosts_(to_hosts),
        only_host_(only_host) {}

  Result<Plan> Run() {
    TP_RETURN_IF_ERROR(Validate());
    TP_RETURN_IF_ERROR(Index());
    for (std::size_t t = 0; t < needs_.size(); ++t) {
      TP_RETURN_IF_ERROR(PlanTensor(static_cast<int32_t>(t)));
    }
    Finalize();
    return std::move(plan_);
  }

 private:
  Status Validate() {
    if (static_cast<int>(from_hosts_.size()) != from_.world_size() ||
        static_cast<int>(to_hosts_.size()) != to_.world_size()) {
      return InvalidArgument(
          "host maps must have one entry per rank (" + std::to_string(from_.world_size()) +
          " old, " + std::to_string(to_.world_size()) + " new), got " +
          std::to_string(from_hosts_.size()) + " and " + std::to_string(to_hosts_.size()));
    }
    int hosts = 0;
    for (const std::vector<int>* m : {&from_hosts_, &to_hosts_}) {
      for (int h : *m) {
        if (h == kLostHost && m == &from_hosts_) {
          any_lost_ = true;
          continue;
        }
        if (h < 0) return InvalidArgument("negative host " + std::to_string(h) + " in a host map");
        hosts = std::max(hosts, h + 1);
      }
    }
    num_hosts_ = hosts;
    if (only_host_ < -1 || only_host_ >= hosts)
      return InvalidArgument("host " + std::to_string(only_host_) + " is not in the host maps (" +
                             std::to_string(hosts) + " hosts)");
    globals_ = GlobalTensors(model_);
    TP_RETURN_IF_ERROR(CheckGlobals(globals_, from_, "old"));
    TP_RETURN_IF_ERROR(CheckGlobals(globals_, to_, "new"));
    return Status::Ok();
  }

  Result<int32_t> Id(const std::string& name) const {
    auto it = ids_.find(name);
    if (it == ids_.end())
      return InvalidArgument("a piece names " + name + ", which is not a global tensor");
    return it->second;
  }

  Status Index() {
    plan_.tensors.reserve(globals_.size());
    for (const GlobalTensor& g : globals_) {
      ids_.emplace(g.name, static_cast<int32_t>(plan_.tensors.size()));
      plan_.tensors.push_back(g.name);
      elem_.push_back(static_cast<int64_t>(DTypeSize(g.dtype)));
    }
    const std::size_t n = globals_.size();
    groups_.resize(n);
    needs_.resize(n);
    // Old pieces: once per distinct tensor list (dp replicas share one), holders per rank.
    std::vector<const std::vector<LocalTensor>*> lists;
    std::unordered_map<const std::vector<LocalTensor>*, std::vector<int32_t>> ranks_of;
    for (const RankLayout& r : from_.ranks) {
      auto [it, fresh] = ranks_of.try_emplace(r.tensors.get());
      if (fresh) lists.push_back(r.tensors.get());
      it->second.push_back(r.rank);
    }
    std::map<std::pair<int32_t, Box>, std::size_t> group_of;
    for (const auto* list : lists) {
      const std::vector<int32_t>& ranks = ranks_of[list];
      TP_ASSIGN_OR_RETURN(const std::vector<int32_t>* ids, IdsOf(list));
      std::size_t pi = 0;
      for (std::size_t lt = 0; lt < list->size(); ++lt) {
        for (const Piece& p : (*list)[lt].pieces) {
          const int32_t id = (*ids)[pi++];
          if (id < 0) continue;
          auto [it, fresh] = group_of.try_emplace({id, p.global}, groups_[id].size());
          if (fresh) groups_[id].push_back({&p.global, {}, {}, -1});
          Group& g = groups_[id][it->second];
          for (int32_t r : ranks) {
            if (from_hosts_[r] == kLostHost) continue;  // its state is gone
            g.holders.push_back({r, from_hosts_[r], static_cast<int32_t>(lt), &p});
          }
        }
      }
    }
    sent_.assign(num_hosts_, 0);
    sets_of_host_.resize(num_hosts_);
    std::map<std::vector<int32_t>, int32_t> set_ids;
    std::vector<int32_t> host_list;
    for (auto& gs : groups_) {
      for (Group& g : gs) {
        std::sort(g.holders.begin(), g.holders.end(), [](const Holder& a, const Holder& b) {
          return a.host != b.host ? a.host < b.host : a.rank < b.rank;
        });
        host_list.clear();
        for (std::size_t x = 0; x < g.holders.size(); ++x) {
          if (x == 0 || g.holders[x].host != g.holders[x - 1].host) {
            g.hosts.push_back({g.holders[x].host, static_cast<int32_t>(x)});
            host_list.push_back(g.holders[x].host);
          }
        }
        auto [it, fresh] = set_ids.try_emplace(host_list, static_cast<int32_t>(host_sets_.size()));
        if (fresh) {
          host_sets_.emplace_back();
          for (int32_t h : host_list) {
            host_sets_.back().insert({0, h});
            sets_of_host_[h].push_back(it->second);
          }
        }
        g.host_set = it->second;
      }
    }
    // New pieces, per tensor, in (host, rank, local tensor, piece) order; counted
    // first, so that each list is allocated once at its size.
    std::vector<std::size_t> count(n, 0);
    for (const RankLayout& r : to_.ranks) {
      TP_ASSIGN_OR_RETURN(const std::vector<int32_t>* ids, IdsOf(r.tensors.get()));
      for (int32_t id : *ids) {
        if (id >= 0) ++count[id];
      }
    }
    for (std::size_t t = 0; t < n; ++t) needs_[t].reserve(count[t]);
    for (const RankLayout& r : to_.ranks) {
      const auto& list = *r.tensors;
      const int32_t host = to_hosts_[r.rank];
      TP_ASSIGN_OR_RETURN(const std::vector<int32_t>* ids, IdsOf(&list));
      std::size_t pi = 0;
      for (std::size_t lt = 0; lt < list.size(); ++lt) {
        for (const Piece& p : list[lt].pieces) {
          const int32_t id = (*ids)[pi++];
          if (id < 0) continue;
          needs_[id].push_back({host, r.rank, static_cast<int32_t>(lt), &p});
          if (only_host_ < 0 || host == only_host_)
            plan_.stats.bytes_total += Volume(p.global) * elem_[id];
        }
      }
    }
    std::size_t total_needs = 0;
    for (const auto& ns : needs_) {
      for (const Need& n : ns) total_needs += only_host_ < 0 || n.host == only_host_;
    }
    plan_.ops.reserve(total_needs);  // usually one op or fewer per need
    auto by_host = [](const Need& a, const Need& b) { return a.host < b.host; };
    for (auto& ns : needs_) {
      if (!std::is_sorted(ns.begin(), ns.end(), by_host))
        std::stable_sort(ns.begin(), ns.end(), by_host);
    }
    recv_.assign(num_hosts_, 0);
    to_me_.assign(num_hosts_, 0);
    return Status::Ok();
  }

  // Global tensor ids of the pieces of a tensor list, in (local tensor, piece) order; -1
  // for an empty piece. Computed once per distinct list (dp replicas share one).
  Result<const std::vector<int32_t>*> IdsOf(const std::vector<LocalTensor>* list) {
    auto [it, fresh] = ids_of_.try_emplace(list);
    if (fresh) {
      for (const LocalTensor& t : *list) {
        for (const Piece& p : t.pieces) {
          if (IsEmpty(p.global)) {
            it->second.push_back(-1);
            continue;
          }
          auto id = Id(p.tensor);
          if (!id.ok()) {
            ids_of_.erase(it);
            return id.status();
          }
          it->second.push_back(*id);
        }
      }
    }
    return &it->second;
  }

  // The remote holder of group g (not on host h) on the host that has sent the fewest
  // bytes so far; ties: the lowest host, then its lowest rank. nullptr if none.
  const Holder* PickRemote(const Group& g, int32_t h) const {
    const auto& set = host_sets_[g.host_set];
    auto it = set.begin();
    if (it != set.end() && it->second == h) ++it;
    if (it == set.end()) return nullptr;
    auto at = std::lower_bound(g.hosts.begin(), g.hosts.end(), std::make_pair(it->second, 0));
    return &g.holders[at->second];
  }

  // Host `host` sends `bytes` across hosts: the greedy state of every host set it is in.
  void ChargeSend(int32_t host, int64_t bytes) {
    if (bytes == 0) return;
    for (int32_t sid : sets_of_host_[host]) {
      host_sets_[sid].erase({sent_[host], host});
      host_sets_[sid].insert({sent_[host] + bytes, host});
    }
    sent_[host] += bytes;
  }

  // Index of the local tensor `name` of old rank r, or -1.
  int32_t FindOld(int32_t r, const std::string& name) {
    const auto* list = from_.ranks[r].tensors.get();
    auto [it, fresh] = names_.try_emplace(list);
    if (fresh) {
      for (std::size_t i = 0; i < list->size(); ++i)
        it->second.emplace((*list)[i].name, static_cast<int32_t>(i));
    }
    auto f = it->second.find(name);
    return f == it->second.end() ? -1 : f->second;
  }

  static bool SameTrailingDims(const LocalTensor& a, const LocalTensor& b) {
    if (a.dtype != b.dtype || a.shape.size() != b.shape.size()) return false;
    return std::equal(a.shape.begin() + (a.shape.empty() ? 0 : 1), a.shape.end(),
                      b.shape.begin() + (b.shape.empty() ? 0 : 1));
  }

  // Step 1: parts of remaining_ held by the same device at the same position.
  void TakeInPlace(int32_t tid, const Need& need, const Site& dst) {
    const int32_t r = need.rank;
    if (r >= from_.world_size() || from_hosts_[r] != to_hosts_[r]) return;
    const LocalTensor& nt = (*to_.ranks[r].tensors)[need.tensor];
    const int32_t oi = FindOld(r, nt.name);
    if (oi < 0) return;
    const LocalTensor& ot = (*from_.ranks[r].tensors)[oi];
    if (!SameTrailingDims(ot, nt)) return;
    for (const Piece& op : ot.pieces) {
      if (op.tensor != need.piece->tensor || !Intersects(op.global, *dst.global)) continue;
      const Site src = MakeSite(op.global, op.local, r, oi, from_hosts_[r], false, -1);
      next_.clear();
      for (Box& rem : remaining_) {
        if (!Intersects(rem, op.global)) {
          next_.push_back(std::move(rem));
          continue;
        }
        Box inter = Intersect(rem, op.global);
        for (Box& part : Subtract(rem, inter)) next_.push_back(std::move(part));
        ForEachPart(std::move(inter), src, dst, [&](Box part) {
          Box sr = RegionOf(part, src), dr = RegionOf(part, dst);
          if (sr == dr) {
            plan_.stats.bytes_in_place += Volume(part) * elem_[tid];
            plan_.kept.push_back({tid, std::move(part), r, oi, std::move(sr), r, need.tensor,
                                  std::move(dr), false, -1});
          } else {
            next_.push_back(std::move(part));
          }
        });
      }
      remaining_.swap(next_);
      if (remaining_.empty()) return;
    }
  }

  // Covers what remaining_ shares with box from src into dst, one op per region part;
  // returns the bytes copied across hosts.
  int64_t CoverFrom(int32_t tid, const Box& box, const Site& src, const Site& dst,
                    std::vector<Landed>* landed) {
    int64_t crossed = 0;
    next_.clear();
    for (Box& rem : remaining_) {
      if (!Intersects(rem, box)) {
        next_.push_back(std::move(rem));
        continue;
      }
      Box inter = Intersect(rem, box);
      for (Box& part : Subtract(rem, inter)) next_.push_back(std::move(part));
      ForEachPart(std::move(inter), src, dst, [&](Box part) {
        const int64_t bytes = Volume(part) * elem_[tid];
        if (src.host == dst.host) {
          plan_.stats.bytes_host_local += bytes;
        } else {
          plan_.stats.bytes_cross_host += bytes;
          ++plan_.stats.cross_host_ops;
          crossed += bytes;
          to_me_[src.host] += bytes;
          recv_[dst.host] += bytes;
        }
        Box sr = RegionOf(part, src), dr = RegionOf(part, dst);
        if (landed) landed->push_back({static_cast<int64_t>(plan_.ops.size())});
        plan_.ops.push_back({tid, std::move(part), src.rank, src.tensor, std::move(sr), dst.rank,
                             dst.tensor, std::move(dr), src.is_new, src.is_new ? src.after : -1});
      });
    }
    remaining_.swap(next_);
    return crossed;
  }

  // Holders of each group of tensor tid on host h: index ranges into Group::holders.
  void LocalRanges(int32_t tid, int32_t h,
                   std::vector<std::pair<std::size_t, std::size_t>>& local) {
    const std::vector<Group>& gs = groups_[tid];
    local.resize(gs.size());
    for (std::size_t g = 0; g < gs.size(); ++g) {
      const auto& hs = gs[g].holders;
      auto lo = std::lower_bound(hs.begin(), hs.end(), h,
                                 [](const Holder& x, int32_t v) { return x.host < v; });
      auto hi =
          std::upper_bound(lo, hs.end(), h, [](int32_t v, const Holder& x) { return v < x.host; });
      local[g] = {static_cast<std::size_t>(lo - hs.begin()),
                  static_cast<std::size_t>(hi - hs.begin())};
    }
  }

  Status PlanTensor(int32_t tid) {
    const std::vector<Need>& ns = needs_[tid];
    std::vector<std::pair<std::size_t, std::size_t>> local;
    for (std::size_t i = 0; i < ns.size();) {
      const int32_t h = ns[i].host;
      std::size_t j = i;
      while (j < ns.size() && ns[j].host == h) ++j;
      LocalRanges(tid, h, local);
      if (only_host_ < 0 || h == only_host_) {
        TP_RETURN_IF_ERROR(PlanHost(tid, i, j, local));
        plan_.stats.cross_host_lower_bound += LowerBound(tid, ns, i, j, local) * elem_[tid];
      } else {
        TP_RETURN_IF_ERROR(SimulateHost(tid, i, j, local));
      }
      i = j;
    }
    return Status::Ok();
  }

  Status NotCovered(int32_t tid, int32_t rank, const Box& box) const {
    if (any_lost_) {
      return DataLoss("no surviving replica of " + plan_.tensors[tid] + " box " + ToString(box) +
                      " (every old rank holding it is on a lost host); new rank " +
                      std::to_string(rank) + " needs it");
    }
    return Internal("the old layout holds no replica of " + plan_.tensors[tid] + " box " +
                    ToString(box) + " that new rank " + std::to_string(rank) + " needs");
  }

  // Steps 1-4 for the needs [i, j) of tensor tid, all on one host: the ops.
  Status PlanHost(int32_t tid, std::size_t i, std::size_t j,
                  const std::vector<std::pair<std::size_t, std::size_t>>& local) {
    const std::vector<Need>& ns = needs_[tid];
    const std::vector<Group>& gs = groups_[tid];
    const int32_t h = ns[i].host;
    landed_.clear();
    for (std::size_t k = i; k < j; ++k) {
      const Need& need = ns[k];
      const Site dst =
          MakeSite(need.piece->global, need.piece->local, need.rank, need.tensor, h, true, -1);
      remaining_.assign(1, need.piece->global);
      TakeInPlace(tid, need, dst);
      // Step 2: a replica on this host, the same device first.
      for (std::size_t g = 0; g < gs.size() && !remaining_.empty(); ++g) {
        if (local[g].first == local[g].second || !Intersects(*gs[g].global, need.piece->global))
          continue;
        const Holder* pick = &gs[g].holders[local[g].first];
        for (std::size_t x = local[g].first; x < local[g].second; ++x) {
          if (gs[g].holders[x].rank == need.rank) pick = &gs[g].holders[x];
        }
        const Site src = MakeSite(pick->piece->global, pick->piece->local, pick->rank, pick->tensor,
                                  h, false, -1);
        CoverFrom(tid, *gs[g].global, src, dst, nullptr);
      }
      // Step 3: boxes already delivered to this host.
      for (std::size_t x = 0; x < landed_.size() && !remaining_.empty(); ++x) {
        const CopyOp& l = plan_.ops[landed_[x].op];
        if (!Intersects(l.global, need.piece->global)) continue;
        // Copies: CoverFrom appends to plan_.ops, which may move l.
        const Box global = l.global, region = l.dst;
        const Site src = MakeSite(global, region, l.dst_rank, l.dst_tensor, h, true, landed_[x].op);
        CoverFrom(tid, global, src, dst, nullptr);
      }
      // Step 4: a remote replica on the host that has sent least so far.
      fresh_.clear();
      for (std::size_t g = 0; g < gs.size() && !remaining_.empty(); ++g) {
        bool hit = false;
        for (const Box& rem : remaining_) hit = hit || Intersects(rem, *gs[g].global);
        if (!hit) continue;
        const Holder* pick = PickRemote(gs[g], h);
        if (!pick) continue;
        const Site src = MakeSite(pick->piece->global, pick->piece->local, pick->rank, pick->tensor,
                                  pick->host, false, -1);
        ChargeSend(pick->host, CoverFrom(tid, *gs[g].global, src, dst, &fresh_));
      }
      landed_.insert(landed_.end(), fresh_.begin(), fresh_.end());
      if (!remaining_.empty()) return NotCovered(tid, need.rank, remaining_[0]);
    }
    return Status::Ok();
  }

  // Per-host planning, another host h: only what step 4 of PlanHost would send to h
  // (the greedy choice of every later transfer depends on it), as boxes, no ops. What
  // step 4 sends for a need is, as a set, N \ Held(h) \ (what earlier needs of h
  // received), group by group in group order; steps 1-3 only shape the ops. Hosts with
  // the same needs (the same piece objects: dp replicas share them) and the same held
  // groups send the same amounts, so those are computed once per such host kind.
  Status SimulateHost(int32_t tid, std::size_t i, std::size_t j,
                      const std::vector<std::pair<std::size_t, std::size_t>>& local) {
    const std::vector<Need>& ns = needs_[tid];
    const std::vector<Group>& gs = groups_[tid];
    const int32_t h = ns[i].host;
    key_.assign(reinterpret_cast<const char*>(&tid), sizeof(tid));
    for (std::size_t k = i; k < j; ++k)
      key_.append(reinterpret_cast<const char*>(&ns[k].piece), sizeof(ns[k].piece));
    for (const auto& [lo, hi] : local) key_.push_back(lo == hi ? '0' : '1');
    auto [it, fresh] = charges_.try_emplace(key_);
    SimResult& sim = it->second;
    if (fresh) {
      std::vector<Box> got;  // step 4 deliveries of earlier needs
      for (std::size_t k = i; k < j && sim.failed_need < 0; ++k) {
        remaining_.assign(1, ns[k].piece->global);
        for (std::size_t g = 0; g < gs.size() && !remaining_.empty(); ++g) {
          if (local[g].first != local[g].second) SubtractFrom(remaining_, *gs[g].global);
        }
        for (std::size_t x = 0; x < got.size() && !remaining_.empty(); ++x)
          SubtractFrom(remaining_, got[x]);
        for (std::size_t g = 0; g < gs.size() && !remaining_.empty(); ++g) {
          if (gs[g].holders.empty()) continue;  // every holder lost
          int64_t vol = 0;
          for (const Box& rem : remaining_) {
            if (!Intersects(rem, *gs[g].global)) continue;
            got.push_back(Intersect(rem, *gs[g].global));
            vol += Volume(got.back());
          }
          if (vol == 0) continue;
          sim.charges.push_back({static_cast<int32_t>(g), vol * elem_[tid]});
          SubtractFrom(remaining_, *gs[g].global);
        }
        if (!remaining_.empty()) {
          sim.failed_need = static_cast<int64_t>(k - i);
          sim.failed_box = remaining_[0];
        }
      }
    }
    for (const Charge& c : sim.charges) ChargeSend(PickRemote(gs[c.group], h)->host, c.bytes);
    if (sim.failed_need >= 0) return NotCovered(tid, ns[i + sim.failed_need].rank, sim.failed_box);
    return Status::Ok();
  }

  // |Need(h) \ Held(h)| for one tensor, from union volumes (independent of the cover).
  int64_t LowerBound(int32_t tid, const std::vector<Need>& ns, std::size_t i, std::size_t j,
                     const std::vector<std::pair<std::size_t, std::size_t>>& local) const {
    std::vector<Box> need, both;
    for (std::size_t k = i; k < j; ++k) need.push_back(ns[k].piece->global);
    const std::vector<Group>& gs = groups_[tid];
    for (std::size_t g = 0; g < gs.size(); ++g) {
      if (local[g].first == local[g].second) continue;
      for (const Box& n : need) {
        Box inter = Intersect(n, *gs[g].global);
        if (!IsEmpty(inter)) both.push_back(std::move(inter));
      }
    }
    return UnionVolume(need) - UnionVolume(both);
  }

  void Finalize() {
    PlanStats& s = plan_.stats;
    s.ops = static_cast<int64_t>(plan_.ops.size());
    s.num_hosts = num_hosts_;
    s.host_send_bytes = only_host_ < 0 ? sent_ : to_me_;
    s.host_recv_bytes = recv_;
    for (int64_t b : sent_) s.max_host_send_bytes = std::max(s.max_host_send_bytes, b);
    for (int64_t b : recv_) s.max_host_recv_bytes = std::max(s.max_host_recv_bytes, b);
  }

  const Model& model_;
  const Layout& from_;
  const Layout& to_;
  const std::vector<int>& from_hosts_;
  bool any_lost_ = false;  // some old rank is on kLostHost
  const std::vector<int>& to_hosts_;
  const int only_host_;  // -1: every host
  int num_hosts_ = 0;
  std::vector<GlobalTensor> globals_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<int64_t> elem_;
  std::vector<std::vector<Group>> groups_;
  std::vector<std::vector<Need>> needs_;
  std::unordered_map<const std::vector<LocalTensor>*, std::unordered_map<std::string, int32_t>>
      names_;
  // sent_: cross-host bytes each host has sent so far (the greedy state, all hosts);
  // to_me_: of those, what the planned host(s) receive; recv_: received per planned host.
  std::vector<int64_t> sent_, recv_, to_me_;
  // The distinct holder-host sets of the groups, each ordered by (sent_, host), and the
  // sets each host is in.
  std::vector<std::set<std::pair<int64_t, int32_t>>> host_sets_;
  std::vector<std::vector<int32_t>> sets_of_host_;
  std::unordered_map<const std::vector<LocalTensor>*, std::vector<int32_t>> ids_of_;
  struct SimResult {
    std::vector<Charge> charges;
    int64_t failed_need = -1;
    Box failed_box;
  };
  std::string key_;
  std::unordered_map<std::string, SimResult> charges_;  // SimulateHost per host kind
  std::vector<Landed> landed_, fresh_;
  std::vector<Box> remaining_, next_;
  Plan plan_;
};

void AppendBox(std::string& out, const Box& b) {
  out += '[';
  char buf[48];
  for (std::size_t k = 0; k < b.rank(); ++k) {
    std::snprintf(buf, sizeof(buf), "%s[%lld,%lld]", k ? "," : "",
                  static_cast<long long>(b[k].begin), static_cast<long long>(b[k].end));
    out += buf;
  }
  out += ']';
}

std::string Quote(const std::string& s) { return nlohmann::json(s).dump(); }

void AppendOp(std::string& out, const CopyOp& op, const std::vector<std::string>& tensors,
              const Layout& from, const Layout& to) {
  out += "{\"tensor\":" + Quote(tensors[op.tensor]) + ",\"global\":";
  AppendBox(out, op.global);
  out += ",\"src_rank\":" + std::to_string(op.src_rank) +
         ",\"src_tensor\":" + Quote(SrcTensorName(op, from, to)) + ",\"src\":";
  AppendBox(out, op.src);
  out += ",\"dst_rank\":" + std::to_string(op.dst_rank) +
         ",\"dst_tensor\":" + Quote(DstTensorName(op, to)) + ",\"dst\":";
  AppendBox(out, op.dst);
  out += op.src_new ? ",\"src_layout\":\"new\",\"after\":" + std::to_string(op.after)
                    : ",\"src_layout\":\"old\"";
  out += '}';
}

}  // namespace

std::vector<int> DefaultHosts(int world_size, int gpus_per_host) {
  std::vector<int> hosts(std::max(0, world_size));
  const int k = std::max(1, gpus_per_host);
  for (int r = 0; r < world_size; ++r) hosts[r] = r / k;
  return hosts;
}

Result<Plan> MakePlan(const Model& model, const Layout& from, const Layout& to,
                      const std::vector<int>& from_hosts, const std::vector<int>& to_hosts) {
  return Planner(model, from, to, from_hosts, to_hosts, -1).Run();
}

Result<Plan> MakeHostPlan(const Model& model, const Layout& from, const Layout& to,
                          const std::vector<int>& from_hosts, const std::vector<int>& to_hosts,
                          int host) {
  if (host < 0) return InvalidArgument("host " + std::to_string(host) + " is negative");
  return Planner(model, from, to, from_hosts, to_hosts, host).Run();
}

const std::string& SrcTensorName(const CopyOp& op, const Layout& from, const Layout& to) {
  const Layout& l = op.src_new ? to : from;
  return (*l.ranks[op.src_rank].tensors)[op.src_tensor].name;
}

const std::string& DstTensorName(const CopyOp& op, const Layout& to) {
  return (*to.ranks[op.dst_rank].tensors)[op.dst_tensor].name;
}

std::string PlanToJson(const Plan& plan, const Layout& from, const Layout& to) {
  std::string out = "{\"ops\":[";
  out.reserve(plan.ops.size() * 256 + 1024);
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    out += i ? ",\n" : "\n";
    AppendOp(out, plan.ops[i], plan.tensors, from, to);
  }
  out += "],\n\"kept\":[";
  for (std::size_t i = 0; i < plan.kept.size(); ++i) {
    out += i ? ",\n" : "\n";
    AppendOp(out, plan.kept[i], plan.tensors, from, to);
  }
  const PlanStats& s = plan.stats;
  nlohmann::json st = {{"bytes_total", s.bytes_total},
                       {"bytes_in_place", s.bytes_in_place},
                       {"bytes_host_local", s.bytes_host_local},
                       {"bytes_cross_host", s.bytes_cross_host},
                       {"cross_host_lower_bound", s.cross_host_lower_bound},
                       {"max_host_send_bytes", s.max_host_send_bytes},
                       {"max_host_recv_bytes", s.max_host_recv_bytes},
                       {"ops", s.ops},
                       {"cross_host_ops", s.cross_host_ops},
                       {"kept", plan.kept.size()},
                       {"num_hosts", s.num_hosts},
                       {"host_send_bytes", s.host_send_bytes},
                       {"host_recv_bytes", s.host_recv_bytes}};
  out += "],\n\"stats\":" + st.dump() + "}\n";
  return out;
}

std::string PlanSummary(const Model& model, const Plan& plan, const Layout& from, const Layout& to,
                        const std::vector<int>& from_hosts, const std::vector<int>& to_hosts) {
  const PlanStats& s = plan.stats;
  auto hosts = [](const std::vector<int>& m) {
    int n = 0;
    for (int h : m) n = std::max(n, h + 1);
    return n;
  };
  auto pct = [&](int64_t b) {
    return s.bytes_total ? 100.0 * static_cast<double>(b) / s.bytes_total : 0.0;
  };
  auto argmax = [](const std::vector<int64_t>& v) {
    return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
  };
  char line[512];
  std::string out;
  std::snprintf(line, sizeof(line), "plan %s: %s (%d ranks, %d hosts) -> %s (%d ranks, %d hosts)\n",
                model.name.c_str(), from.config.ToString().c_str(), from.world_size(),
                hosts(from_hosts), to.config.ToString().c_str(), to.world_size(), hosts(to_hosts));
  out += line;
  std::snprintf(line, sizeof(line), "  new layout holds   %12s\n",
                HumanBytes(s.bytes_total).c_str());
  out += line;
  std::snprintf(line, sizeof(line), "  kept in place      %12s  %5.1f%%\n",
                HumanBytes(s.bytes_in_place).c_str(), pct(s.bytes_in_place));
  out += line;
  std::snprintf(line, sizeof(line), "  copied within host %12s  %5.1f%%\n",
                HumanBytes(s.bytes_host_local).c_str(), pct(s.bytes_host_local));
  out += line;
  std::snprintf(line, sizeof(line), "  sent across hosts  %12s  %5.1f%%  (lower bound %s%s)\n",
                HumanBytes(s.bytes_cross_host).c_str(), pct(s.bytes_cross_host),
                HumanBytes(s.cross_host_lower_bound).c_str(),
                s.bytes_cross_host == s.cross_host_lower_bound ? ", met" : ", NOT met");
  out += line;
  if (s.bytes_cross_host > 0) {
    std::snprintf(line, sizeof(line),
                  "  busiest host       host %d sends %s; host %d receives %s\n",
                  argmax(s.host_send_bytes), HumanBytes(s.max_host_send_bytes).c_str(),
                  argmax(s.host_recv_bytes), HumanBytes(s.max_host_recv_bytes).c_str());
    out += line;
  }
  std::snprintf(
      line, sizeof(line), "  ops                %12lld  (%lld across hosts, %zu regions kept)\n",
      static_cast<long long>(s.ops), static_cast<long long>(s.cross_host_ops), plan.kept.size());
  out += line;
  return out;
}

}  // namespace tenplex::plan
