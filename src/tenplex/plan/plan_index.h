// The planner's index of two layouts: per global tensor, the old pieces grouped by
// global box (a group's holders are the dp replicas of one box) and the new pieces
// ("needs") in (host, rank, local tensor, piece) order.
//
// Ranks of one dp group share their tensor list (one shared_ptr in the layout), so the
// pieces of each distinct list are resolved to global tensor ids once. A group names
// the old lists that hold its box (its sources), not every rank: its holders are the
// live ranks of those lists, found per host through a small per-host table (the lists on
// the host and each one's lowest live rank there). The index of the old layout is thus
// O(distinct lists · pieces + ranks), not O(ranks · pieces). Old ranks on kLostHost hold
// nothing.
//
// Per-host planning (only_host >= 0) indexes the needs of that host and of one host of
// each kind only. Two hosts are of one kind when their new ranks have the same tensor
// lists in rank order and their old ranks the same set of lists: then they need the
// same pieces and hold the same groups (planner.h: SimulateHost), for every tensor.
// Everything points into the layouts, which must outlive the index.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tenplex/geometry/box.h"
#include "tenplex/model/model.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/util/status.h"

namespace tenplex::plan {

struct Holder {
  int32_t rank;
  int32_t host;
  int32_t tensor;  // index of the old rank's local tensor
  const Piece* piece;
};

// One old local tensor, in one distinct tensor list, that holds a group's box.
struct Source {
  int32_t list;    // index of the old tensor list (PlanIndex::lists_on_host)
  int32_t tensor;  // local tensor in that list
  const Piece* piece;
};

// Old pieces of one global tensor with one global box: the replicas of that box.
struct Group {
  const Box* global;
  std::vector<Source> sources;  // ascending list
  int32_t hosts = -1;           // PlanIndex::host_sets: the live hosts holding it
};

struct Need {
  int32_t host;
  int32_t rank;
  int32_t tensor;  // index of the new rank's local tensor
  const Piece* piece;
};

struct PlanIndex {
  int num_hosts = 0;
  bool any_lost = false;                   // some old rank is on kLostHost
  std::vector<std::string> names;          // global tensors in model order
  std::vector<int64_t> elem;               // element size per global tensor
  std::vector<std::vector<Group>> groups;  // per global tensor
  // Per global tensor, sorted by host: every new rank's pieces, or with only_host the
  // pieces of that host and of each kind's representative.
  std::vector<std::vector<Need>> needs;
  int64_t bytes_total = 0;        // bytes of the needs of the planned host(s)
  std::size_t planned_needs = 0;  // number of those needs
  // Per distinct tensor list of either layout: the global tensor id of each piece in
  // (local tensor, piece) order, -1 for an empty piece.
  std::unordered_map<const std::vector<LocalTensor>*, std::vector<int32_t>> piece_ids;

  // The old layout by distinct tensor list (numbered in the order of their first rank).
  std::vector<int32_t> list_of_rank;  // per old rank; -1 when lost
  // Per host: (list, lowest live rank of that list on the host), ascending list.
  std::vector<std::vector<std::pair<int32_t, int32_t>>> lists_on_host;
  std::vector<std::vector<int32_t>> host_sets;  // distinct ascending host sets of groups

  // Each host's kind (-1: no new ranks) and each kind's hosts, ascending (the first is
  // its representative).
  std::vector<int32_t> kind_of_host;
  std::vector<std::vector<int32_t>> kind_hosts;

  // The holder of group g on host h with the lowest rank; rank -1 if none.
  Holder FirstOn(const Group& g, int32_t h) const;
  // Old rank `rank` as a holder of g on host h; rank -1 unless it is one.
  Holder RankOn(const Group& g, int32_t h, int32_t rank, const std::vector<int>& from_hosts) const;
};

// Checks the inputs as MakePlan documents (host maps, layouts against the model, `only
// host` in the maps; -1 plans every host) and builds the index.
Result<PlanIndex> BuildPlanIndex(const Model& model, const Layout& from, const Layout& to,
                                 const std::vector<int>& from_hosts,
                                 const std::vector<int>& to_hosts, int only_host);

// The ranks of host h's needs of global tensor id, in need order (new ranks on h in rank
// order, each once per piece of that tensor): for error messages about a host whose
// needs are not indexed.
std::vector<int32_t> NeedRanksOf(const PlanIndex& ix, const Layout& to,
                                 const std::vector<int>& to_hosts, int32_t host, int32_t id);

}  // namespace tenplex::plan
