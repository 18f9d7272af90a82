// Reconfiguration planner: which bytes move from where to where when a PTC changes
// from an old layout A to a new layout B (spec §8).
//
// Setting. Old rank r runs on host hostA(r), new rank r on host hostB(r) (by default
// r / gpus_per_host); old rank r and new rank r are the same device when
// hostA(r) == hostB(r). Every global element e of a global tensor is held by some old
// locations (rank, local tensor, position) and needed at some new locations.
//
// Lower bound. Let Need(h) be the global elements that the new ranks on host h need
// and Held(h) those the old ranks on h hold. Each element of Need(h) \ Held(h) must
// reach h from another host at least once, so every plan sends at least
//     LB = Σ_h |Need(h) \ Held(h)|   (in bytes: × element size)
// across hosts.
//
// Algorithm. Pieces are indexed by global tensor, and the old pieces of a tensor are
// grouped by global box (the dp replicas of a piece share one box and differ only in
// the holder), so all work is per tensor and per host. For each global tensor, for
// each host h, the new pieces ("needs") of h's ranks are taken in order (rank, local
// tensor, piece). The need's global box N is kept as a list of disjoint remaining
// boxes (box difference, box_set.h) and covered from these sources, in this order:
//   1. in place: old rank r (same device) holds the element at the same position:
//      a local tensor with the same name and dtype, the same trailing dimensions
//      (shape[1:]) and the same local region, so the element sits at the same byte
//      offset and a store that keeps (or grows or shrinks at its end) the buffer keeps
//      it. No op; counted in bytes_in_place and listed in Plan::kept.
//   2. an old replica on h: the same device first, else the lowest rank on h; an op
//      with src_layout "old".
//   3. a box an earlier op already delivered to h from another host (the "landed"
//      list of h): an op with src_layout "new" reading that op's destination.
//   4. a remote old replica, the hosts that hold the box taken in turn: the step-4
//      sends from one set of holder hosts (ascending) are numbered in plan order, and
//      send k comes from the set's host k mod |set| (the next one if that is h), its
//      lowest rank. The op lands on the need's rank and its destination joins h's
//      landed list. The choice depends on how many sends the set made before, not on
//      their bytes, so a host can count that without planning the other hosts.
// Every op is thus a box intersection; no element is ever visited on its own.
//
// Why bytes_cross_host == LB. An element e needed on h crosses hosts only in step 4.
// Step 4 sees e only when no old rank on h holds e (else step 2 takes it, as every
// replica of a box holds all of it) and no earlier op delivered e to h (else step 3
// takes it). So e ∈ Need(h) \ Held(h) and e crosses at most once into h; and it
// crosses at least once, because nothing else can provide it. Summing over hosts and
// elements, bytes_cross_host = LB for every allocation and every pair of layouts.
// The stats compute LB a second way, by union volumes
//     |Need(h) \ Held(h)| = |∪ N_i| − |∪ (N_i ∩ H_j)|
// over the needs N_i and held boxes H_j of h (a coordinate sweep, box_set.h), and the
// tests compare both against a per-element count.
//
// Flat regions. A ZeRO-1 flat shard maps a global box G to a 1-D range in row-major
// order over G. A sub-box of G is one range only when it is contiguous in G's dense
// extents, so a fragment is cut into ContiguousParts relative to G whenever its
// source or destination side is flat; every op's region is then one box or one range.
//
// Cost. With n_t old and new pieces of tensor t on a host, a tensor costs
// O(n_t · groups_t) box intersections; the plan is O(total pieces · replicas-groups),
// independent of tensor sizes. Nothing is per element.
//
// Parallel. Tensors are planned independently except for step 4's send numbers, which
// run on across tensors. MakePlan therefore counts first, on one thread, each host
// set's sends before every tensor, from what one host of each kind sends per tensor
// times the kind's hosts (as MakeHostPlan counts, with every host counted), and then
// plans the tensors on several threads, each starting from its counted numbers. Each
// tensor's ops go to a slot of the plan's op list as large as its needs (the serial loop
// reserves as much), and are then packed in tensor order, so the parallel plan touches
// no more memory than the serial one. The plan is the serial one, op for op. A need no
// replica covers stops the count, and the serial loop then names it.
//
// Determinism: inputs are visited in fixed orders (global tensor order of the model,
// host, rank, local tensor, piece) and ties are broken by host then rank, so every
// host computes the same plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tenplex/geometry/box.h"
#include "tenplex/model/model.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/util/status.h"

namespace tenplex::plan {

// One copy of the elements of global box `global` of global tensor `tensor`.
// Source: old rank src_rank's local tensor src_tensor (an index into its tensor list),
// region src; or, when src_new, new rank src_rank's local tensor already filled by op
// `after`. Destination: new rank dst_rank's local tensor dst_tensor, region dst.
// Regions are boxes of the local tensor with global's extents, or 1-D ranges of equal
// volume in a flat local tensor (spec §6).
struct CopyOp {
  int32_t tensor = 0;  // index into Plan::tensors
  Box global;
  int32_t src_rank = 0;
  int32_t src_tensor = 0;
  Box src;
  int32_t dst_rank = 0;
  int32_t dst_tensor = 0;
  Box dst;
  bool src_new = false;
  int64_t after = -1;  // src_new: the op that filled the source region
};

struct PlanStats {
  int64_t bytes_total = 0;       // non-padding bytes of the new layout
  int64_t bytes_in_place = 0;    // kept where they are (Plan::kept)
  int64_t bytes_host_local = 0;  // ops whose source is on the destination's host
  int64_t bytes_cross_host = 0;  // ops from another host
  int64_t cross_host_lower_bound = 0;
  int64_t max_host_send_bytes = 0;
  int64_t max_host_recv_bytes = 0;
  int64_t ops = 0;
  int64_t cross_host_ops = 0;
  int num_hosts = 0;
  std::vector<int64_t> host_send_bytes;  // per host, cross-host only
  std::vector<int64_t> host_recv_bytes;
  friend bool operator==(const PlanStats&, const PlanStats&) = default;
};

struct Plan {
  std::vector<std::string> tensors;  // global tensor names; CopyOp::tensor indexes this
  std::vector<CopyOp> ops;           // in execution order
  std::vector<CopyOp> kept;          // in place: src == dst rank, same position; no copy
  PlanStats stats;
};

// Rank r on host r / gpus_per_host, for world_size ranks.
std::vector<int> DefaultHosts(int world_size, int gpus_per_host);

// In from_hosts: the old rank's host is lost, its state unavailable. The plan then takes
// every box from surviving replicas; a box with none fails with DataLoss naming the
// tensor and box.
inline constexpr int kLostHost = -1;

// Plans the move from layout `from` to layout `to` of `model`; from_hosts[r] is the
// host of old rank r, to_hosts[r] that of new rank r. Fails (InvalidArgument) when a
// layout does not belong to the model or a host map has the wrong size or a negative
// host, and (Internal) if the old layout does not hold an element the new one needs.
// threads: how many plan the tensors ("Parallel"); 0: one per hardware thread for a
// plan of 65,536 needs or more, else one. Every count gives the same plan.
Result<Plan> MakePlan(const Model& model, const Layout& from, const Layout& to,
                      const std::vector<int>& from_hosts, const std::vector<int>& to_hosts,
                      int threads = 0);

// Per-host planning: the part of MakePlan's plan that host `host` (of to_hosts)
// executes, computed without the other hosts' ops. Its ops are exactly the ops of
// MakePlan whose destination rank is on `host`, in the same order, with `after`
// renumbered to indices of this list (an op's source from the new layout is always an
// op of the same host); kept likewise. The stats describe those ops: bytes_total,
// bytes_in_place, bytes_host_local, bytes_cross_host, cross_host_lower_bound, ops and
// cross_host_ops of `host` alone, host_send_bytes[x] = what host x sends to `host`,
// host_recv_bytes only `host`'s entry, the maxima over those entries. Errors as
// MakePlan (a box no replica holds is named for whichever host meets it first).
//
// Cost. Step 4's choice needs only the number of sends each holder set made before
// `host`: what one host of each kind (plan_index.h) sends per tensor, computed once per
// kind, times the number of that kind's hosts before `host` (a binary search). No other
// host is visited. The index holds the old layout per distinct tensor list and the new
// one for `host` and one host per kind. So the plan costs O(ranks) once (placing the
// ranks, finding kinds) plus O(tensors · kinds · groups) box operations: a TP change, a
// host loss and a DP scale-down cost about the same at 100k GPUs as at 1k.
Result<Plan> MakeHostPlan(const Model& model, const Layout& from, const Layout& to,
                          const std::vector<int>& from_hosts, const std::vector<int>& to_hosts,
                          int host);

// Spec §8 JSON: {"ops": [...], "stats": {...}}; ops carry "after" when src_layout is
// "new", stats also carry per-host send/receive bytes, op counts and "kept".
std::string PlanToJson(const Plan& plan, const Layout& from, const Layout& to);
// A summary a person reads at a glance.
std::string PlanSummary(const Model& model, const Plan& plan, const Layout& from, const Layout& to,
                        const std::vector<int>& from_hosts, const std::vector<int>& to_hosts);

// Local name of op.src / op.dst (from `from` or `to` as the op says).
const std::string& SrcTensorName(const CopyOp& op, const Layout& from, const Layout& to);
const std::string& DstTensorName(const CopyOp& op, const Layout& to);

}  // namespace tenplex::plan
