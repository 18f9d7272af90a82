#include "tenplex/plan/planner.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "tenplex/plan/box_set.h"
#include "tenplex/plan/plan_index.h"
#include "tenplex/plan/plan_lists.h"
#include "tenplex/plan/regions.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::plan {
namespace {

// A box delivered to a host by an earlier op (Plan::ops index): its global box and
// destination are that op's.
struct Landed {
  int64_t op;
};

// One step-4 transfer of a host that is only simulated (per-host planning): `bytes`
// of group `group` from a remote holder.
struct Charge {
  int32_t group;
  int64_t bytes;
};

// What one kind of simulated host sends for one tensor, in order; failed_need >= 0: the
// index of its first need that no replica covers (failed_box: what is missing).
struct SimResult {
  std::vector<Charge> charges;
  int64_t failed_need = -1;
  Box failed_box;
};

// Parallel planning: per tensor, each host set of its groups with the number of step-4
// sends it made in the tensors before (what PickRemote counts from).
using SetBases = std::vector<std::pair<int32_t, int64_t>>;

// Steps 1-4 of planner.h over an index, tensor by tensor and host by host.
class Planner {
 public:
  Planner(const PlanIndex& ix, const Layout& from, const Layout& to,
          const std::vector<int>& from_hosts, const std::vector<int>& to_hosts, int only_host)
      : ix_(ix),
        from_(from),
        to_(to),
        from_hosts_(from_hosts),
        to_hosts_(to_hosts),
        only_host_(only_host),
        recv_(ix_.num_hosts, 0),
        to_me_(ix_.num_hosts, 0),
        sends_(ix_.host_sets.size(), 0),
        base_(ix_.host_sets.size(), 0),
        tensor_sends_(ix_.host_sets.size(), 0),
        own_before_(ix_.host_sets.size(), 0),
        in_place_of_(to.world_size(), nullptr) {}

  Result<Plan> Run() {
    plan_.tensors = ix_.names;
    plan_.stats.bytes_total = ix_.bytes_total;
    plan_.ops.reserve(ix_.planned_needs);  // usually one op or fewer per need
    HugePages(plan_.ops.data(), plan_.ops.capacity() * sizeof(CopyOp));
    sims_.resize(ix_.kind_hosts.size());
    for (std::size_t t = 0; t < ix_.needs.size(); ++t) {
      const auto tid = static_cast<int32_t>(t);
      TP_RETURN_IF_ERROR(only_host_ < 0 ? PlanTensor(tid) : PlanTensorFor(tid));
    }
    Finalize();
    return std::move(plan_);
  }

  // Parallel planning, pass 1 (planner.h, "Parallel"): every tensor's SetBases, counted
  // from what each kind of host sends (as per-host planning counts them). False when a
  // need is not covered: the caller then plans serially, which names it.
  bool CountSends(std::vector<SetBases>& bases) {
    sims_.resize(ix_.kind_hosts.size());
    bases.resize(ix_.needs.size());
    for (std::size_t t = 0; t < ix_.needs.size(); ++t) {
      const auto tid = static_cast<int32_t>(t);
      for (const Group& g : ix_.groups[t]) {
        if (std::none_of(bases[t].begin(), bases[t].end(),
                         [&](const auto& b) { return b.first == g.hosts; }))
          bases[t].emplace_back(g.hosts, sends_[g.hosts]);
      }
      bool covered = true;
      ForEachHostRun(ix_.needs[t], [&](int32_t h, std::size_t i, std::size_t j) {
        const std::vector<int32_t>& hosts = ix_.kind_hosts[ix_.kind_of_host[h]];
        if (hosts[0] != h) return true;
        const SimResult& sim = SimulateKind(tid, i, j);
        covered = sim.failed_need < 0;
        for (const Charge& c : sim.charges)
          sends_[ix_.groups[t][c.group].hosts] += static_cast<int64_t>(hosts.size());
        return covered;
      });
      if (!covered) return false;
    }
    return true;
  }

  // Pass 2: tensor tid's ops and kept regions, `after` indexing its ops, as MakePlan's
  // serial loop makes them when its sends so far are `bases`. The ops go to slot[0,
  // room) when they fit (count: how many), else to `spill`; the statistics add up in
  // this planner (AddStats). Its op list is a scratch buffer reused from tensor to tensor.
  Status PlanOneTensor(int32_t tid, const SetBases& bases, CopyOp* slot, std::size_t room,
                       std::size_t& count, std::vector<CopyOp>& spill, std::vector<CopyOp>& kept) {
    for (const auto& [set, sends] : bases) sends_[set] = sends;
    plan_.ops.clear();
    plan_.kept.clear();
    Status status = PlanTensor(tid);
    count = plan_.ops.size();
    if (count <= room) {
      std::move(plan_.ops.begin(), plan_.ops.end(), slot);
    } else {
      spill = std::move(plan_.ops);
    }
    kept.assign(std::make_move_iterator(plan_.kept.begin()),
                std::make_move_iterator(plan_.kept.end()));
    return status;
  }

  // This planner's statistics of the tensors it planned, added into `into`.
  void AddStats(PlanStats& into, std::vector<int64_t>& recv, std::vector<int64_t>& to_me) const {
    const PlanStats& s = plan_.stats;
    into.bytes_in_place += s.bytes_in_place;
    into.bytes_host_local += s.bytes_host_local;
    into.bytes_cross_host += s.bytes_cross_host;
    into.cross_host_lower_bound += s.cross_host_lower_bound;
    into.cross_host_ops += s.cross_host_ops;
    for (std::size_t h = 0; h < recv.size(); ++h) recv[h] += recv_[h], to_me[h] += to_me_[h];
  }

 private:
  // The remote holder of group g (not on host h) for the next step-4 send from its
  // host set: the sets' sends are numbered in plan order (tensor, receiving host, need,
  // group), and send k goes to the set's host k mod |set| (the next one when that is h),
  // its lowest rank there.
  Holder PickRemote(const Group& g, int32_t h) const {
    const std::vector<int32_t>& hosts = ix_.host_sets[g.hosts];
    const auto n = static_cast<int64_t>(hosts.size());
    if (n == 0) return {-1, -1, -1, nullptr};
    int64_t at = sends_[g.hosts] % n;
    if (hosts[at] == h) {
      if (n == 1) return {-1, -1, -1, nullptr};
      at = (at + 1) % n;
    }
    return ix_.FirstOn(g, hosts[at]);
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

  // Per group of tensor tid, its holder on host h with the lowest rank (rank -1: none).
  void LocalHolders(int32_t tid, int32_t h, std::vector<Holder>& local) const {
    const std::vector<Group>& gs = ix_.groups[tid];
    local.resize(gs.size());
    for (std::size_t g = 0; g < gs.size(); ++g) local[g] = ix_.FirstOn(gs[g], h);
  }

  // fn(h, i, j) for each host h's needs [i, j) of `ns` (sorted by host), in host order,
  // until fn returns false.
  template <typename Fn>
  static void ForEachHostRun(const std::vector<Need>& ns, Fn&& fn) {
    for (std::size_t i = 0; i < ns.size();) {
      const int32_t h = ns[i].host;
      std::size_t j = i;
      while (j < ns.size() && ns[j].host == h) ++j;
      if (!fn(h, i, j)) return;
      i = j;
    }
  }

  // Every host plans its needs, in host order.
  Status PlanTensor(int32_t tid) {
    Status status = Status::Ok();
    ForEachHostRun(ix_.needs[tid], [&](int32_t, std::size_t i, std::size_t j) {
      status = PlanOwn(tid, i, j);
      return status.ok();
    });
    return status;
  }

  // The ops of needs [i, j) of tensor tid, all on one planned host, and its lower bound.
  Status PlanOwn(int32_t tid, std::size_t i, std::size_t j) {
    LocalHolders(tid, ix_.needs[tid][i].host, local_);
    TP_RETURN_IF_ERROR(PlanHost(tid, i, j, local_));
    plan_.stats.cross_host_lower_bound +=
        LowerBound(tid, ix_.needs[tid], i, j, local_) * ix_.elem[tid];
    return Status::Ok();
  }

  // Per-host planning: the planned host's ops. Its step-4 choices depend only on how
  // many sends each host set made before it (PickRemote), which is counted from what
  // each kind of host sends (SimulateKind, once per kind on its representative's needs)
  // times the number of its hosts before the planned one: no other host is visited.
  // A host before the planned one that no replica covers fails first, as in MakePlan.
  Status PlanTensorFor(int32_t tid) {
    const std::vector<Need>& ns = ix_.needs[tid];
    const std::vector<Group>& gs = ix_.groups[tid];
    std::size_t own_i = 0, own_j = 0;
    int32_t failed_host = INT32_MAX, failed_kind = -1;
    touched_.clear();
    ForEachHostRun(ns, [&](int32_t h, std::size_t i, std::size_t j) {
      if (h == only_host_) own_i = i, own_j = j;
      const int32_t kind = ix_.kind_of_host[h];
      const std::vector<int32_t>& hosts = ix_.kind_hosts[kind];
      if (hosts[0] == h) {
        const SimResult& sim = SimulateKind(tid, i, j);
        if (sim.failed_need >= 0 && h < failed_host) failed_host = h, failed_kind = kind;
        const auto before =
            std::lower_bound(hosts.begin(), hosts.end(), only_host_) - hosts.begin();
        for (const Charge& c : sim.charges) {
          const int32_t set = gs[c.group].hosts;
          if (tensor_sends_[set] == 0 && own_before_[set] == 0) touched_.push_back(set);
          tensor_sends_[set] += static_cast<int64_t>(hosts.size());
          own_before_[set] += before;
        }
      }
      return true;
    });
    for (int32_t set : touched_) sends_[set] = base_[set] + own_before_[set];
    Status status = Status::Ok();
    if (own_i < own_j && only_host_ <= failed_host) status = PlanOwn(tid, own_i, own_j);
    if (status.ok() && failed_kind >= 0 && failed_host != only_host_) {
      const SimResult& sim = sims_[failed_kind];
      const std::vector<int32_t> ranks = NeedRanksOf(ix_, to_, to_hosts_, failed_host, tid);
      status = NotCovered(tid, ranks.at(sim.failed_need), sim.failed_box);
    }
    for (int32_t set : touched_) {
      base_[set] += tensor_sends_[set];
      tensor_sends_[set] = own_before_[set] = 0;
    }
    return status;
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
  Status PlanHost(int32_t tid, std::size_t i, std::size_t j, const std::vector<Holder>& local) {
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
        if (local[g].rank < 0 || !Intersects(*gs[g].global, need.piece->global)) continue;
        Holder pick = ix_.RankOn(gs[g], h, need.rank, from_hosts_);
        if (pick.rank < 0) pick = local[g];
        const Site src =
            MakeSite(pick.piece->global, pick.piece->local, pick.rank, pick.tensor, h, false, -1);
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
        const Holder pick = PickRemote(gs[g], h);
        if (pick.rank < 0) continue;
        const Site src = MakeSite(pick.piece->global, pick.piece->local, pick.rank, pick.tensor,
                                  pick.host, false, -1);
        if (CoverFrom(tid, *gs[g].global, src, dst, &fresh_) > 0) ++sends_[gs[g].hosts];
      }
      landed_.insert(landed_.end(), fresh_.begin(), fresh_.end());
      if (!remaining_.empty()) return NotCovered(tid, need.rank, remaining_[0]);
    }
    return Status::Ok();
  }

  // Per-host planning, another host h: only what step 4 of PlanHost would send to h
  // (the number of sends is what step 4 of later hosts needs), as boxes, no ops. What
  // step 4 sends for a need is, as a set, N \ Held(h) \ (what earlier needs of h
  // received), group by group in group order; steps 1-3 only shape the ops. Hosts of
  // one kind (plan_index.h) have the same needs and held groups, so they send the same
  // amounts: computed once per kind, on the needs [i, j) of its representative.
  const SimResult& SimulateKind(int32_t tid, std::size_t i, std::size_t j) {
    const std::vector<Need>& ns = ix_.needs[tid];
    const std::vector<Group>& gs = ix_.groups[tid];
    LocalHolders(tid, ns[i].host, local_);
    SimResult& sim = sims_[ix_.kind_of_host[ns[i].host]];
    sim.charges.clear();
    sim.failed_need = -1;
    std::vector<Box> got;  // step 4 deliveries of earlier needs
    for (std::size_t k = i; k < j && sim.failed_need < 0; ++k) {
      remaining_.assign(1, ns[k].piece->global);
      for (std::size_t g = 0; g < gs.size() && !remaining_.empty(); ++g) {
        if (local_[g].rank >= 0) SubtractFrom(remaining_, *gs[g].global);
      }
      for (std::size_t x = 0; x < got.size() && !remaining_.empty(); ++x)
        SubtractFrom(remaining_, got[x]);
      for (std::size_t g = 0; g < gs.size() && !remaining_.empty(); ++g) {
        if (ix_.host_sets[gs[g].hosts].empty()) continue;  // every holder lost
        int64_t vol = 0;
        for (const Box& rem : remaining_) {
          if (!Intersects(rem, *gs[g].global)) continue;
          got.push_back(Intersect(rem, *gs[g].global));
          vol += Volume(got.back());
        }
        if (vol > 0) sim.charges.push_back({static_cast<int32_t>(g), vol * ix_.elem[tid]});
        if (vol == 0) continue;
        SubtractFrom(remaining_, *gs[g].global);
      }
      if (!remaining_.empty()) {
        sim.failed_need = static_cast<int64_t>(k - i);
        sim.failed_box = remaining_[0];
      }
    }
    return sim;
  }

  // |Need(h) \ Held(h)| for one tensor, from union volumes (independent of the cover).
  int64_t LowerBound(int32_t tid, const std::vector<Need>& ns, std::size_t i, std::size_t j,
                     const std::vector<Holder>& local) {
    lb_need_.clear();
    for (std::size_t k = i; k < j; ++k) {
      // Replicas on one host share their piece: count it once.
      if (k == i || ns[k].piece != ns[k - 1].piece) lb_need_.push_back(&ns[k].piece->global);
    }
    std::size_t both = 0;  // lb_both_[0, both): the needs' parts that h holds
    const std::vector<Group>& gs = ix_.groups[tid];
    for (std::size_t g = 0; g < gs.size(); ++g) {
      if (local[g].rank < 0) continue;
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

  void Finalize() { FinalizeStats(plan_, ix_.num_hosts, to_me_, recv_); }

  const PlanIndex& ix_;
  const Layout& from_;
  const Layout& to_;
  const std::vector<int>& from_hosts_;
  const std::vector<int>& to_hosts_;
  const int only_host_;  // -1: every host
  // to_me_: of the cross-host bytes each host sent, what the planned host(s) receive;
  // recv_: received per planned host.
  std::vector<int64_t> recv_, to_me_;
  // Per host set (PlanIndex::host_sets): sends_, its step-4 sends so far (PickRemote);
  // per-host planning: base_, its sends in the tensors before this one; tensor_sends_,
  // those in this tensor; own_before_, those of the hosts before the planned one.
  std::vector<int64_t> sends_, base_, tensor_sends_, own_before_;
  std::vector<int32_t> touched_;  // the sets with sends in this tensor
  // InPlaceOf: per new rank, and per distinct (old list, new list) pair.
  std::vector<const std::vector<InPlace>*> in_place_of_;
  std::map<std::pair<const void*, const void*>, std::vector<InPlace>> in_place_lists_;
  std::vector<SimResult> sims_;  // SimulateKind's, per kind of host
  std::vector<Holder> local_;    // LocalHolders' of the host at hand
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
  return Planner(ix, from, to, from_hosts, to_hosts, only_host).Run();
}

// MakePlan on `threads` threads (planner.h, "Parallel"): each tensor's starting sends
// counted, the tensors planned on the threads, their ops joined in tensor order.
Result<Plan> RunParallel(const Model& model, const Layout& from, const Layout& to,
                         const std::vector<int>& from_hosts, const std::vector<int>& to_hosts,
                         int threads) {
  TP_ASSIGN_OR_RETURN(PlanIndex ix, BuildPlanIndex(model, from, to, from_hosts, to_hosts, -1));
  if (threads == 0) threads = ThreadsFor(ix.planned_needs);
  std::vector<SetBases> bases;
  if (threads <= 1 || !Planner(ix, from, to, from_hosts, to_hosts, -1).CountSends(bases))
    return Planner(ix, from, to, from_hosts, to_hosts, -1).Run();
  // Each tensor's ops go to a slot of the plan's list as large as its needs (the serial
  // loop reserves as much), then are packed in tensor order.
  const std::size_t n = ix.needs.size();
  std::vector<std::size_t> slot(n + 1, 0), count(n, 0);
  for (std::size_t t = 0; t < n; ++t) slot[t + 1] = slot[t] + ix.needs[t].size();
  Plan plan;
  plan.tensors = ix.names;
  plan.stats.bytes_total = ix.bytes_total;
  plan.ops.reserve(slot[n]);
  HugePages(plan.ops.data(), plan.ops.capacity() * sizeof(CopyOp));
  plan.ops.resize(slot[n]);
  std::vector<std::vector<CopyOp>> spill(n), kept(n);
  std::vector<Status> status(n, Status::Ok());
  std::vector<std::unique_ptr<Planner>> workers;
  for (int w = 0; w < threads; ++w)
    workers.push_back(std::make_unique<Planner>(ix, from, to, from_hosts, to_hosts, -1));
  ForEachConcurrently(n, threads, [&](std::size_t w, std::size_t t) {
    status[t] =
        workers[w]->PlanOneTensor(static_cast<int32_t>(t), bases[t], plan.ops.data() + slot[t],
                                  slot[t + 1] - slot[t], count[t], spill[t], kept[t]);
  });
  for (const Status& s : status) TP_RETURN_IF_ERROR(s);
  PackInOrder(slot, count, spill, threads, plan.ops);
  JoinInOrder(kept, threads, false, plan.kept);
  std::vector<int64_t> recv(ix.num_hosts, 0), sent(ix.num_hosts, 0);
  for (const auto& w : workers) w->AddStats(plan.stats, recv, sent);
  FinalizeStats(plan, ix.num_hosts, std::move(sent), std::move(recv));
  return plan;
}

}  // namespace

std::vector<int> DefaultHosts(int world_size, int gpus_per_host) {
  std::vector<int> hosts(std::max(0, world_size));
  const int k = std::max(1, gpus_per_host);
  for (int r = 0; r < world_size; ++r) hosts[r] = r / k;
  return hosts;
}

Result<Plan> MakePlan(const Model& model, const Layout& from, const Layout& to,
                      const std::vector<int>& from_hosts, const std::vector<int>& to_hosts,
                      int threads) {
  if (threads < 0) return InvalidArgument("threads " + std::to_string(threads) + " is negative");
  return RunParallel(model, from, to, from_hosts, to_hosts, threads);
}

Result<Plan> MakeHostPlan(const Model& model, const Layout& from, const Layout& to,
                          const std::vector<int>& from_hosts, const std::vector<int>& to_hosts,
                          int host) {
  if (host < 0) return InvalidArgument("host " + std::to_string(host) + " is negative");
  return Run(model, from, to, from_hosts, to_hosts, host);
}

}  // namespace tenplex::plan
