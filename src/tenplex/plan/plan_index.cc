#include "tenplex/plan/plan_index.h"

#include <algorithm>
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
  // Old pieces: once per distinct tensor list (dp replicas share one), holders per rank;
  // then each group's holders sorted by (host, rank) and its distinct hosts.
  Status IndexOld() {
    std::vector<const std::vector<LocalTensor>*> lists;
    std::unordered_map<const std::vector<LocalTensor>*, std::vector<int32_t>> ranks_of;
    for (const RankLayout& r : from_.ranks) {
      auto [it, fresh] = ranks_of.try_emplace(r.tensors.get());
      if (fresh) lists.push_back(r.tensors.get());
      it->second.push_back(r.rank);
    }
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
    for (const auto* list : lists) {
      const std::vector<int32_t>& ranks = ranks_of[list];
      TP_ASSIGN_OR_RETURN(const std::vector<int32_t>* ids, IdsOf(list));
      std::size_t pi = 0;
      for (std::size_t lt = 0; lt < list->size(); ++lt) {
        for (const Piece& p : (*list)[lt].pieces) {
          const int32_t id = (*ids)[pi++];
          if (id < 0) continue;
          auto& gs = ix_.groups[id];
          auto [it, fresh] = group_of.try_emplace({id, &p.global}, gs.size());
          if (fresh) gs.push_back({&p.global, {}, {}, -1});
          Group& g = gs[it->second];
          for (int32_t r : ranks) {
            if (from_hosts_[r] == kLostHost) continue;  // its state is gone
            g.holders.push_back({r, from_hosts_[r], static_cast<int32_t>(lt), &p});
          }
        }
      }
    }
    for (auto& gs : ix_.groups) {
      for (Group& g : gs) {
        auto by_host_rank = [](const Holder& a, const Holder& b) {
          return a.host != b.host ? a.host < b.host : a.rank < b.rank;
        };
        // Usually in order already (one tensor list, ranks ascending on ascending hosts).
        if (!std::is_sorted(g.holders.begin(), g.holders.end(), by_host_rank))
          std::sort(g.holders.begin(), g.holders.end(), by_host_rank);
        for (std::size_t x = 0; x < g.holders.size(); ++x) {
          if (x == 0 || g.holders[x].host != g.holders[x - 1].host)
            g.hosts.push_back({g.holders[x].host, static_cast<int32_t>(x)});
        }
      }
    }
    return Status::Ok();
  }

  // New pieces, per tensor, in (host, rank, local tensor, piece) order; counted first,
  // so that each list is allocated once at its size.
  Status IndexNew() {
    std::vector<std::size_t> count(globals_.size(), 0);
    for (const RankLayout& r : to_.ranks) {
      TP_ASSIGN_OR_RETURN(const std::vector<int32_t>* ids, IdsOf(r.tensors.get()));
      for (int32_t id : *ids) {
        if (id >= 0) ++count[id];
      }
    }
    for (std::size_t t = 0; t < globals_.size(); ++t) ix_.needs[t].reserve(count[t]);
    for (const RankLayout& r : to_.ranks) {
      const auto& list = *r.tensors;
      const int32_t host = to_hosts_[r.rank];
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
  PlanIndex ix_;
};

}  // namespace

Result<PlanIndex> BuildPlanIndex(const Model& model, const Layout& from, const Layout& to,
                                 const std::vector<int>& from_hosts,
                                 const std::vector<int>& to_hosts, int only_host) {
  IndexBuilder b(from, to, from_hosts, to_hosts, only_host);
  TP_RETURN_IF_ERROR(b.Validate(model));
  return b.Build();
}

}  // namespace tenplex::plan
