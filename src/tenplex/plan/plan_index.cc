#include "tenplex/plan/plan_index.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <unordered_map>

#include "tenplex/plan/planner.h"

namespace tenplex::plan {
namespace {

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

class IndexBuilder {
 public:
  IndexBuilder(const Layout& from, const Layout& to, const std::vector<int>& from_hosts,
               const std::vector<int>& to_hosts, int only_host)
      : from_(from), to_(to), from_hosts_(from_hosts), to_hosts_(to_hosts), only_host_(only_host) {}

  Status Validate(const Model& model) {
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
          ix_.any_lost = true;
          continue;
        }
        if (h < 0) return InvalidArgument("negative host " + std::to_string(h) + " in a host map");
        hosts = std::max(hosts, h + 1);
      }
    }
    ix_.num_hosts = hosts;
    if (only_host_ < -1 || only_host_ >= hosts)
      return InvalidArgument("host " + std::to_string(only_host_) + " is not in the host maps (" +
                             std::to_string(hosts) + " hosts)");
    globals_ = GlobalTensors(model);
    TP_RETURN_IF_ERROR(CheckGlobals(globals_, from_, "old"));
    TP_RETURN_IF_ERROR(CheckGlobals(globals_, to_, "new"));
    return Status::Ok();
  }

  Result<PlanIndex> Build() {
    ix_.names.reserve(globals_.size());
    for (const GlobalTensor& g : globals_) {
      ids_.emplace(g.name, static_cast<int32_t>(ix_.names.size()));
      ix_.names.push_back(g.name);
      ix_.elem.push_back(static_cast<int64_t>(DTypeSize(g.dtype)));
    }
    ix_.groups.resize(globals_.size());
    ix_.needs.resize(globals_.size());
    TP_RETURN_IF_ERROR(IndexOld());
    TP_RETURN_IF_ERROR(IndexNew());
    return std::move(ix_);
  }

 private:
  // Old pieces: once per distinct tensor list (dp replicas share one), each group with
  // the lists that hold its box; then the per-host table of lists and the host sets.
  Status IndexOld() {
    TP_RETURN_IF_ERROR(IndexOldLists());
    // (global tensor id, global box by value) -> index into ix_.groups[id].
    struct Key {
      int32_t id;
      const Box* box;
      bool operator==(const Key& o) const { return id == o.id && *box == *o.box; }
    };
    struct Hash {
      std::size_t operator()(const Key& k) const {
        uint64_t h = static_cast<uint64_t>(k.id) * 0x9E3779B97F4A7C15ull;
        for (const Interval& d : k.box->dims) {
          h = (h ^ static_cast<uint64_t>(d.begin)) * 0x100000001B3ull;
          h = (h ^ static_cast<uint64_t>(d.end)) * 0x100000001B3ull;
        }
        return static_cast<std::size_t>(h ^ (h >> 29));
      }
    };
    std::unordered_map<Key, std::size_t, Hash> group_of;
    for (std::size_t l = 0; l < lists_.size(); ++l) {
      TP_ASSIGN_OR_RETURN(const std::vector<int32_t>* ids, IdsOf(lists_[l]));
      std::size_t pi = 0;
      for (std::size_t lt = 0; lt < lists_[l]->size(); ++lt) {
        for (const Piece& p : (*lists_[l])[lt].pieces) {
          const int32_t id = (*ids)[pi++];
          if (id < 0) continue;
          auto& gs = ix_.groups[id];
          auto [it, fresh] = group_of.try_emplace({id, &p.global}, gs.size());
          if (fresh) gs.push_back({&p.global, {}, -1});
          Group& g = gs[it->second];
          if (!g.sources.empty() && g.sources.back().list == static_cast<int32_t>(l)) {
            return Internal("the old layout's rank " + std::to_string(ranks_of_list_[l]) +
                            " holds " + p.tensor + " box " + ToString(p.global) + " twice");
          }
          g.sources.push_back({static_cast<int32_t>(l), static_cast<int32_t>(lt), &p});
        }
      }
    }
    std::map<std::vector<int32_t>, int32_t> set_of_lists;  // groups held by several lists
    for (auto& gs : ix_.groups) {
      for (Group& g : gs) {
        if (g.sources.size() == 1) {
          g.hosts = set_of_list_[g.sources[0].list];
          continue;
        }
        std::vector<int32_t> key;
        for (const Source& s : g.sources) key.push_back(s.list);
        auto [it, fresh] = set_of_lists.try_emplace(std::move(key), 0);
        if (fresh) {
          std::vector<int32_t> hosts;
          for (const Source& s : g.sources) {
            const std::vector<int32_t>& more = ix_.host_sets[set_of_list_[s.list]];
            std::vector<int32_t> merged;
            std::set_union(hosts.begin(), hosts.end(), more.begin(), more.end(),
                           std::back_inserter(merged));
            hosts.swap(merged);
          }
          it->second = Intern(std::move(hosts));
        }
        g.hosts = it->second;
      }
    }
    return Status::Ok();
  }

  // The distinct old tensor lists (in order of their first rank), each rank's list, the
  // lists on each host with their lowest live rank, and each list's set of live hosts.
  Status IndexOldLists() {
    std::unordered_map<const std::vector<LocalTensor>*, int32_t> list_id;
    ix_.list_of_rank.assign(from_.world_size(), -1);
    ix_.lists_on_host.assign(ix_.num_hosts, {});
    for (const RankLayout& r : from_.ranks) {
      auto [it, fresh] = list_id.try_emplace(r.tensors.get(), static_cast<int32_t>(lists_.size()));
      if (fresh) {
        lists_.push_back(r.tensors.get());
        ranks_of_list_.push_back(r.rank);
      }
      const int h = from_hosts_[r.rank];
      if (h == kLostHost) continue;  // its state is gone
      ix_.list_of_rank[r.rank] = it->second;
      auto& on = ix_.lists_on_host[h];
      auto at = std::lower_bound(on.begin(), on.end(), std::make_pair(it->second, INT32_MIN));
      if (at != on.end() && at->first == it->second) {
        at->second = std::min(at->second, static_cast<int32_t>(r.rank));
      } else {
        on.insert(at, {it->second, r.rank});
      }
    }
    std::vector<std::vector<int32_t>> hosts_of(lists_.size());
    for (int h = 0; h < ix_.num_hosts; ++h) {
      for (const auto& [l, rank] : ix_.lists_on_host[h]) hosts_of[l].push_back(h);
    }
    for (std::vector<int32_t>& hosts : hosts_of) set_of_list_.push_back(Intern(std::move(hosts)));
    return Status::Ok();
  }

  // The index of a host set in ix_.host_sets, added when new.
  int32_t Intern(std::vector<int32_t> hosts) {
    auto [it, fresh] =
        set_ids_.try_emplace(std::move(hosts), static_cast<int32_t>(ix_.host_sets.size()));
    if (fresh) ix_.host_sets.push_back(it->first);
    return it->second;
  }

  // The kind of each host with new ranks (plan_index.h) and one representative per
  // kind, the lowest host.
  void IndexKinds() {
    std::vector<std::string> key(ix_.num_hosts);
    for (const RankLayout& r : to_.ranks) {
      const auto* list = r.tensors.get();
      key[to_hosts_[r.rank]].append(reinterpret_cast<const char*>(&list), sizeof(list));
    }
    std::unordered_map<std::string, int32_t> kinds;
    ix_.kind_of_host.assign(ix_.num_hosts, -1);
    for (int h = 0; h < ix_.num_hosts; ++h) {
      if (key[h].empty()) continue;
      key[h].push_back('|');
      for (const auto& [l, rank] : ix_.lists_on_host[h])
        key[h].append(reinterpret_cast<const char*>(&l), sizeof(l));
      auto [it, fresh] = kinds.try_emplace(std::move(key[h]), static_cast<int32_t>(kinds.size()));
      if (fresh) ix_.kind_hosts.emplace_back();
      ix_.kind_hosts[it->second].push_back(h);
      ix_.kind_of_host[h] = it->second;
    }
  }

  // New pieces, per tensor, in (host, rank, local tensor, piece) order, of every host or
  // (per-host planning) of the planned host and the kinds' representatives; counted
  // first, so that each list is allocated once at its size.
  Status IndexNew() {
    std::vector<char> wanted(ix_.num_hosts, only_host_ < 0 ? 1 : 0);
    IndexKinds();  // MakePlan's parallel pass counts sends per kind too
    if (only_host_ >= 0) {
      wanted[only_host_] = 1;
      for (const std::vector<int32_t>& hosts : ix_.kind_hosts) wanted[hosts[0]] = 1;
    }
    std::vector<std::size_t> count(globals_.size(), 0);
    for (const RankLayout& r : to_.ranks) {
      if (!wanted[to_hosts_[r.rank]]) continue;
      TP_ASSIGN_OR_RETURN(const std::vector<int32_t>* ids, IdsOf(r.tensors.get()));
      for (int32_t id : *ids) {
        if (id >= 0) ++count[id];
      }
    }
    for (std::size_t t = 0; t < globals_.size(); ++t) ix_.needs[t].reserve(count[t]);
    for (const RankLayout& r : to_.ranks) {
      const auto& list = *r.tensors;
      const int32_t host = to_hosts_[r.rank];
      if (!wanted[host]) continue;
      const bool planned = only_host_ < 0 || host == only_host_;
      TP_ASSIGN_OR_RETURN(const std::vector<int32_t>* ids, IdsOf(&list));
      std::size_t pi = 0;
      for (std::size_t lt = 0; lt < list.size(); ++lt) {
        for (const Piece& p : list[lt].pieces) {
          const int32_t id = (*ids)[pi++];
          if (id < 0) continue;
          ix_.needs[id].push_back({host, r.rank, static_cast<int32_t>(lt), &p});
          if (!planned) continue;
          ix_.bytes_total += Volume(p.global) * ix_.elem[id];
          ++ix_.planned_needs;
        }
      }
    }
    auto by_host = [](const Need& a, const Need& b) { return a.host < b.host; };
    for (auto& ns : ix_.needs) {
      if (!std::is_sorted(ns.begin(), ns.end(), by_host))
        std::stable_sort(ns.begin(), ns.end(), by_host);
    }
    return Status::Ok();
  }

  Result<int32_t> Id(const std::string& name) const {
    auto it = ids_.find(name);
    if (it == ids_.end())
      return InvalidArgument("a piece names " + name + ", which is not a global tensor");
    return it->second;
  }

  // Global tensor ids of the pieces of a tensor list, in (local tensor, piece) order; -1
  // for an empty piece. Computed once per distinct list (dp replicas share one).
  Result<const std::vector<int32_t>*> IdsOf(const std::vector<LocalTensor>* list) {
    auto [it, fresh] = ix_.piece_ids.try_emplace(list);
    if (fresh) {
      for (const LocalTensor& t : *list) {
        for (const Piece& p : t.pieces) {
          if (IsEmpty(p.global)) {
            it->second.push_back(-1);
            continue;
          }
          auto id = Id(p.tensor);
          if (!id.ok()) {
            ix_.piece_ids.erase(it);
            return id.status();
          }
          it->second.push_back(*id);
        }
      }
    }
    return &it->second;
  }

  const Layout& from_;
  const Layout& to_;
  const std::vector<int>& from_hosts_;
  const std::vector<int>& to_hosts_;
  const int only_host_;
  std::vector<GlobalTensor> globals_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<const std::vector<LocalTensor>*> lists_;  // distinct old tensor lists
  std::vector<int32_t> ranks_of_list_;                  // the first rank of each
  std::vector<int32_t> set_of_list_;                    // ix_.host_sets index of each
  std::map<std::vector<int32_t>, int32_t> set_ids_;     // ix_.host_sets by value
  PlanIndex ix_;
};

}  // namespace

Holder PlanIndex::FirstOn(const Group& g, int32_t h) const {
  Holder best{-1, h, -1, nullptr};
  if (h < 0 || h >= static_cast<int32_t>(lists_on_host.size())) return best;
  for (const auto& [l, rank] : lists_on_host[h]) {
    if (best.rank >= 0 && rank > best.rank) continue;
    auto s = std::lower_bound(g.sources.begin(), g.sources.end(), l,
                              [](const Source& x, int32_t v) { return x.list < v; });
    if (s != g.sources.end() && s->list == l) best = {rank, h, s->tensor, s->piece};
  }
  return best;
}

Holder PlanIndex::RankOn(const Group& g, int32_t h, int32_t rank,
                         const std::vector<int>& from_hosts) const {
  if (rank < 0 || rank >= static_cast<int32_t>(list_of_rank.size()) || from_hosts[rank] != h ||
      list_of_rank[rank] < 0)
    return {-1, h, -1, nullptr};
  const int32_t l = list_of_rank[rank];
  auto s = std::lower_bound(g.sources.begin(), g.sources.end(), l,
                            [](const Source& x, int32_t v) { return x.list < v; });
  if (s == g.sources.end() || s->list != l) return {-1, h, -1, nullptr};
  return {rank, h, s->tensor, s->piece};
}

std::vector<int32_t> NeedRanksOf(const PlanIndex& ix, const Layout& to,
                                 const std::vector<int>& to_hosts, int32_t host, int32_t id) {
  std::vector<int32_t> ranks;
  for (const RankLayout& r : to.ranks) {
    if (to_hosts[r.rank] != host) continue;
    for (int32_t x : ix.piece_ids.at(r.tensors.get())) {
      if (x == id) ranks.push_back(r.rank);
    }
  }
  return ranks;
}

Result<PlanIndex> BuildPlanIndex(const Model& model, const Layout& from, const Layout& to,
                                 const std::vector<int>& from_hosts,
                                 const std::vector<int>& to_hosts, int only_host) {
  IndexBuilder b(from, to, from_hosts, to_hosts, only_host);
  TP_RETURN_IF_ERROR(b.Validate(model));
  return b.Build();
}

}  // namespace tenplex::plan
