#include "tenplex/plan/planner.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>

#include "tenplex/plan/box_set.h"
#include "tenplex/plan/plan_index.h"
#include "tenplex/plan/regions.h"
#include "tenplex/plan/send_balance.h"

namespace tenplex::plan {
namespace {

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

// A hint for a large array written once (the op lists of a large plan): back it with
// transparent huge pages, so that it faults in 2 MiB steps rather than 4 KiB ones
// (page faults dominate on virtual machines). The whole 2 MiB pages inside it only.
void HugePages(const void* data, std::size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

// a ∩ b into out, reusing out's storage.
void IntersectInto(const Box& a, const Box& b, Box& out) {
  out.dims.resize(a.rank());
  for (std::size_t k = 0; k < a.rank(); ++k) {
    out[k].begin = std::max(a[k].begin, b[k].begin);
    out[k].end = std::max(out[k].begin, std::min(a[k].end, b[k].end));
  }
}

// Steps 1-4 of planner.h over an index, tensor by tensor and host by host.
class Planner {
 public:
  Planner(PlanIndex ix, const Layout& from, const Layout& to, const std::vector<int>& from_hosts,
          const std::vector<int>& to_hosts, int only_host)
      : ix_(std::move(ix)),
        from_(from),
        to_(to),
        from_hosts_(from_hosts),
        to_hosts_(to_hosts),
        only_host_(only_host),
        balance_(ix_.num_hosts),
        recv_(ix_.num_hosts, 0),
        to_me_(ix_.num_hosts, 0),
        in_place_of_(to.world_size(), nullptr) {
    std::vector<int32_t> hosts;
    for (auto& gs : ix_.groups) {
      for (Group& g : gs) {
        hosts.clear();
        for (const auto& [h, first] : g.hosts) hosts.push_back(h);
        g.host_set = balance_.SetOf(hosts);
      }
    }
  }

  Result<Plan> Run() {
    plan_.tensors = ix_.names;
    plan_.stats.bytes_total = ix_.bytes_total;
    plan_.ops.reserve(ix_.planned_needs);  // usually one op or fewer per need
    HugePages(plan_.ops.data(), plan_.ops.capacity() * sizeof(CopyOp));
    for (std::size_t t = 0; t < ix_.needs.size(); ++t) {
      TP_RETURN_IF_ERROR(PlanTensor(static_cast<int32_t>(t)));
    }
    Finalize();
    return std::move(plan_);
  }

 private:
  // The remote holder of group g (not on host h) on the host that has sent the fewest
  // bytes so far; ties: the lowest host, then its lowest rank. nullptr if none.
  const Holder* PickRemote(const Group& g, int32_t h) const {
    const int32_t host = balance_.Pick(g.host_set, h);
    if (host < 0) return nullptr;
    auto at = std::lower_bound(g.hosts.begin(), g.hosts.end(), std::make_pair(host, 0));
    return &g.holders[at->second];
  }

  // Where an element of a new local tensor can stay in place: old rank r's local tensor
  // with the same name, dtype and trailing dimensions (tensor -1: none), and the global
  // tensor ids of its pieces.
  struct InPlace {
    int32_t tensor = -1;
    const int32_t* piece_ids = nullptr;
  };

  // Per local tensor of new rank r, its InPlace. Computed once per distinct pair of (old,
  // new) tensor lists.
  const std::vector<InPlace>& InPlaceOf(int32_t r) {
    const std::vector<InPlace>*& slot = in_place_of_[r];
    if (slot) return *slot;
    const auto* olist = from_.ranks[r].tensors.get();
    const auto* nlist = to_.ranks[r].tensors.get();
    auto [it, fresh] = in_place_lists_.try_emplace({olist, nlist});
    if (fresh) {
      std::unordered_map<std::string_view, int32_t> by_name;
      std::vector<std::size_t> first(olist->size() + 1, 0);  // first piece of each tensor
      for (std::size_t i = 0; i < olist->size(); ++i) {
        by_name.emplace((*olist)[i].name, static_cast<int32_t>(i));
        first[i + 1] = first[i] + (*olist)[i].pieces.size();
      }
      const std::vector<int32_t>& ids = ix_.piece_ids.at(olist);
      it->second.reserve(nlist->size());
      for (const LocalTensor& nt : *nlist) {
        auto f = by_name.find(nt.name);
        if (f == by_name.end() || !SameTrailingDims((*olist)[f->second], nt)) {
          it->second.push_back({});
        } else {
          it->second.push_back({f->second, ids.data() + first[f->second]});
        }
      }
    }
    slot = &it->second;
    return *slot;
  }

  static bool SameTrailingDims(const LocalTensor& a, const LocalTensor& b) {
    if (a.dtype != b.dtype || a.shape.size() != b.shape.size()) return false;
    return std::equal(a.shape.begin() + (a.shape.empty() ? 0 : 1), a.shape.end(),
                      b.shape.begin() + (b.shape.empty() ? 0 : 1));
  }

  // Cuts remaining_ by box: the parts outside stay; each part inside that is one region
  // on both sites goes to take(part), which returns false to leave it in remaining_.
  template <typename Take>
  void Carve(const Box& box, const Site& src, const Site& dst, Take&& take) {
    next_.clear();
    for (Box& rem : remaining_) {
      if (!Intersects(rem, box)) {
        next_.push_back(std::move(rem));
        continue;
      }
      Box inter;
      if (Contains(box, rem)) {
        inter = std::move(rem);  // the usual case: all of rem is inside
      } else {
        inter = Intersect(rem, box);
        for (Box& part : Subtract(rem, inter)) next_.push_back(std::move(part));
      }
      ForEachPart(std::move(inter), src, dst, [&](Box part) {
        if (!take(part)) next_.push_back(std::move(part));
      });
    }
    remaining_.swap(next_);
  }

  // Step 1: parts of remaining_ held by the same device at the same position.
  void TakeInPlace(int32_t tid, const Need& need, const Site& dst) {
    const int32_t r = need.rank;
    if (r >= from_.world_size() || from_hosts_[r] != to_hosts_[r]) return;
    const InPlace in_place = InPlaceOf(r)[need.tensor];
    const int32_t oi = in_place.tensor;
    if (oi < 0) return;
    const LocalTensor& ot = (*from_.ranks[r].tensors)[oi];
    for (std::size_t pi = 0; pi < ot.pieces.size(); ++pi) {
      const Piece& op = ot.pieces[pi];
      if (in_place.piece_ids[pi] != tid || !Intersects(op.global, *dst.global)) continue;
      const Site src = MakeSite(op.global, op.local, r, oi, from_hosts_[r], false, -1);
      Carve(op.global, src, dst, [&](Box& part) {
        Box sr = RegionOf(part, src), dr = RegionOf(part, dst);
        if (sr != dr) return false;
        plan_.stats.bytes_in_place += Volume(part) * ix_.elem[tid];
        plan_.kept.push_back(
            {tid, std::move(part), r, oi, std::move(sr), r, need.tensor, std::move(dr), false, -1});
        return true;
      });
      if (remaining_.empty()) return;
    }
  }

  // Covers what remaining_ shares with box from src into dst, one op per region part;
  // returns the bytes copied across hosts.
  int64_t CoverFrom(int32_t tid, const Box& box, const Site& src, const Site& dst,
                    std::vector<Landed>* landed) {
    int64_t crossed = 0;
    Carve(box, src, dst, [&](Box& part) {
      const int64_t bytes = Volume(part) * ix_.elem[tid];
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
      return true;
    });
    return crossed;
  }

  // Holders of each group of tensor tid on host h: index ranges into Group::holders.
  void LocalRanges(int32_t tid, int32_t h,
                   std::vector<std::pair<std::size_t, std::size_t>>& local) {
    const std::vector<Group>& gs = ix_.groups[tid];
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
    const std::vector<Need>& ns = ix_.needs[tid];
    std::vector<std::pair<std::size_t, std::size_t>> local;
    for (std::size_t i = 0; i < ns.size();) {
      const int32_t h = ns[i].host;
      std::size_t j = i;
      while (j < ns.size() && ns[j].host == h) ++j;
      LocalRanges(tid, h, local);
      if (only_host_ < 0 || h == only_host_) {
        TP_RETURN_IF_ERROR(PlanHost(tid, i, j, local));
        plan_.stats.cross_host_lower_bound += LowerBound(tid, ns, i, j, local) * ix_.elem[tid];
      } else {
        TP_RETURN_IF_ERROR(SimulateHost(tid, i, j, local));
      }
      i = j;
    }
    return Status::Ok();
  }

  Status NotCovered(int32_t tid, int32_t rank, const Box& box) const {
    if (ix_.any_lost) {
      return DataLoss("no surviving replica of " + ix_.names[tid] + " box " + ToString(box) +
                      " (every old rank holding it is on a lost host); new rank " +
                      std::to_string(rank) + " needs it");
    }
    return Internal("the old layout holds no replica of " + ix_.names[tid] + " box " +
                    ToString(box) + " that new rank " + std::to_string(rank) + " needs");
  }

  // Steps 1-4 for the needs [i, j) of tensor tid, all on one host: the ops.
  Status PlanHost(int32_t tid, std::size_t i, std::size_t j,
                  const std::vector<std::pair<std::size_t, std::size_t>>& local) {
    const std::vector<Need>& ns = ix_.needs[tid];
    const std::vector<Group>& gs = ix_.groups[tid];
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
        balance_.Charge(pick->host, CoverFrom(tid, *gs[g].global, src, dst, &fresh_));
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
    const std::vector<Need>& ns = ix_.needs[tid];
    const std::vector<Group>& gs = ix_.groups[tid];
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
          sim.charges.push_back({static_cast<int32_t>(g), vol * ix_.elem[tid]});
          SubtractFrom(remaining_, *gs[g].global);
        }
        if (!remaining_.empty()) {
          sim.failed_need = static_cast<int64_t>(k - i);
          sim.failed_box = remaining_[0];
        }
      }
    }
    for (const Charge& c : sim.charges) balance_.Charge(PickRemote(gs[c.group], h)->host, c.bytes);
    if (sim.failed_need >= 0) return NotCovered(tid, ns[i + sim.failed_need].rank, sim.failed_box);
    return Status::Ok();
  }

  // |Need(h) \ Held(h)| for one tensor, from union volumes (independent of the cover).
  int64_t LowerBound(int32_t tid, const std::vector<Need>& ns, std::size_t i, std::size_t j,
                     const std::vector<std::pair<std::size_t, std::size_t>>& local) {
    lb_need_.clear();
    for (std::size_t k = i; k < j; ++k) {
      // Replicas on one host share their piece: count it once.
      if (k == i || ns[k].piece != ns[k - 1].piece) lb_need_.push_back(&ns[k].piece->global);
    }
    std::size_t both = 0;  // lb_both_[0, both): the needs' parts that h holds
    const std::vector<Group>& gs = ix_.groups[tid];
    for (std::size_t g = 0; g < gs.size(); ++g) {
      if (local[g].first == local[g].second) continue;
      for (const Box* n : lb_need_) {
        if (!Intersects(*n, *gs[g].global)) continue;
        if (both == lb_both_.size()) lb_both_.emplace_back();
        IntersectInto(*n, *gs[g].global, lb_both_[both++]);
      }
    }
    lb_ptrs_.clear();
    for (std::size_t x = 0; x < both; ++x) lb_ptrs_.push_back(&lb_both_[x]);
    return UnionVolume(lb_need_) - UnionVolume(lb_ptrs_);
  }

  void Finalize() {
    PlanStats& s = plan_.stats;
    s.ops = static_cast<int64_t>(plan_.ops.size());
    s.num_hosts = ix_.num_hosts;
    s.host_send_bytes = only_host_ < 0 ? balance_.sent() : to_me_;
    s.host_recv_bytes = recv_;
    for (int64_t b : balance_.sent()) s.max_host_send_bytes = std::max(s.max_host_send_bytes, b);
    for (int64_t b : recv_) s.max_host_recv_bytes = std::max(s.max_host_recv_bytes, b);
  }

  PlanIndex ix_;
  const Layout& from_;
  const Layout& to_;
  const std::vector<int>& from_hosts_;
  const std::vector<int>& to_hosts_;
  const int only_host_;  // -1: every host
  SendBalance balance_;  // the greedy state, all hosts
  // to_me_: of the cross-host bytes each host sent, what the planned host(s) receive;
  // recv_: received per planned host.
  std::vector<int64_t> recv_, to_me_;
  // InPlaceOf: per new rank, and per distinct (old list, new list) pair.
  std::vector<const std::vector<InPlace>*> in_place_of_;
  std::map<std::pair<const void*, const void*>, std::vector<InPlace>> in_place_lists_;
  struct SimResult {
    std::vector<Charge> charges;
    int64_t failed_need = -1;
    Box failed_box;
  };
  std::string key_;
  std::unordered_map<std::string, SimResult> charges_;  // SimulateHost per host kind
  std::vector<Landed> landed_, fresh_;
  std::vector<Box> remaining_, next_;
  std::vector<const Box*> lb_need_, lb_ptrs_;  // LowerBound's scratch
  std::vector<Box> lb_both_;
  Plan plan_;
};

Result<Plan> Run(const Model& model, const Layout& from, const Layout& to,
                 const std::vector<int>& from_hosts, const std::vector<int>& to_hosts,
                 int only_host) {
  TP_ASSIGN_OR_RETURN(PlanIndex ix,
                      BuildPlanIndex(model, from, to, from_hosts, to_hosts, only_host));
  return Planner(std::move(ix), from, to, from_hosts, to_hosts, only_host).Run();
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
  return Run(model, from, to, from_hosts, to_hosts, -1);
}

Result<Plan> MakeHostPlan(const Model& model, const Layout& from, const Layout& to,
                          const std::vector<int>& from_hosts, const std::vector<int>& to_hosts,
                          int host) {
  if (host < 0) return InvalidArgument("host " + std::to_string(host) + " is negative");
  return Run(model, from, to, from_hosts, to_hosts, host);
}

}  // namespace tenplex::plan
