// The planner's index of two layouts: per global tensor, the old pieces grouped by
// global box (a group's holders are the dp replicas of one box) and the new pieces
// ("needs") in (host, rank, local tensor, piece) order.
//
// Ranks of one dp group share their tensor list (one shared_ptr in the layout), so the
// pieces of each distinct list are resolved to global tensor ids once, and a group
// collects the ranks of every list that holds its box. Old ranks on kLostHost hold
// nothing. Everything points into the layouts, which must outlive the index.
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

// Old pieces of one global tensor with one global box: the replicas of that box.
struct Group {
  const Box* global;
  std::vector<Holder> holders;  // sorted by (host, rank)
  // Distinct holder hosts (ascending) with each one's first (lowest-rank) holder, and the
  // id of that host set in the planner's SendBalance.
  std::vector<std::pair<int32_t, int32_t>> hosts;
  int32_t host_set = -1;
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
  std::vector<std::vector<Need>> needs;    // per global tensor, sorted by host
  int64_t bytes_total = 0;                 // bytes of the needs of the planned host(s)
  std::size_t planned_needs = 0;           // number of those needs
  // Per distinct tensor list of either layout: the global tensor id of each piece in
  // (local tensor, piece) order, -1 for an empty piece.
  std::unordered_map<const std::vector<LocalTensor>*, std::vector<int32_t>> piece_ids;
};

// Checks the inputs as MakePlan documents (host maps, layouts against the model, `only
// host` in the maps; -1 plans every host) and builds the index.
Result<PlanIndex> BuildPlanIndex(const Model& model, const Layout& from, const Layout& to,
                                 const std::vector<int>& from_hosts,
                                 const std::vector<int>& to_hosts, int only_host);

}  // namespace tenplex::plan
