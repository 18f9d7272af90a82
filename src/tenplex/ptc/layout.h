// Layouts: for a (model, parallel config), what every rank holds (spec §4-§6).
//
// A rank holds local tensors; each local tensor is described by pieces
// {tensor, global, local}: `global` is a box of a global tensor and `local` a box of
// the local tensor with the same extents, or, for a 1-D flat local tensor (ZeRO-1), a
// range of equal volume. Elements correspond in row-major order over the boxes; local
// elements covered by no piece are padding (zero).
//
// TP slicing, with t = tp rank and T = tp:
//   replicate      whole tensor, one piece;
//   split dim k    part t of T equal parts of dim k;
//   blocks(B)      dim 0 is B blocks, each split in T parts; local = parts t in block
//                  order (B pieces);
//   vocab          Vp = ceil(V/(m T)) m T rows split in T parts of Vp/T; rows >= V
//                  are padding.
// With tp_weights (spec §9) the parts are unequal: the split dim is U whole units (a
// query group of rows or columns, one row per block, m vocabulary rows; TpUnitsOf) and
// rank t holds its contiguous range of Apportion(U, tp_weights) (TpUnitRange), so local
// shapes differ between tp ranks; without weights the same code gives the even split.
// dp_weights do not change what a rank holds (they weight the data, data/order.h).
// Stage s holds layers [bounds[s], bounds[s+1]) (renumbered from 0 in local names),
// "first" tensors on stage 0, "last" tensors on stage pp-1, and aliases whose target
// lives on another stage. Without ZeRO, optimizer companions follow their parameter;
// with zero=1 the stage's local parameters, flattened in order with padding, are
// padded to a multiple of dp and split in dp equal ranges.
//
// Ranks of one (stage, tp rank) share one tensor list when zero=0, so a layout of
// thousands of ranks stays small.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tenplex/geometry/box.h"
#include "tenplex/geometry/dtype.h"
#include "tenplex/model/model.h"
#include "tenplex/ptc/config.h"

namespace tenplex {

struct Piece {
  std::string tensor;  // global tensor name
  Box global;
  Box local;  // same extents as global, or a 1-D range of equal volume
};

struct LocalTensor {
  std::string name;
  // The global parameter this tensor slices, or whose optimizer state it is; empty for
  // the ZeRO-1 flat shards (they span many parameters).
  std::string param;
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<Piece> pieces;
  int64_t bytes() const { return Volume(shape) * static_cast<int64_t>(DTypeSize(dtype)); }
};

struct RankLayout {
  int rank = 0;
  int tp = 0;  // tp rank
  int pp = 0;  // pp rank
  int dp = 0;  // dp rank
  std::shared_ptr<const std::vector<LocalTensor>> tensors;
  int64_t bytes() const;
  // The local tensor with this name, or nullptr.
  const LocalTensor* Find(const std::string& name) const;
};

struct Layout {
  ParallelConfig config;
  std::vector<int> stage_bounds;  // pp + 1 entries
  std::vector<RankLayout> ranks;  // index = rank
  std::map<std::string, GlobalTensor> globals;
  int world_size() const { return static_cast<int>(ranks.size()); }
};

// ZeRO-1 (spec §5): `total` flat elements padded to a multiple of dp and split in dp
// equal ranges; [begin, end) is rank dp_rank's, padded the padded total.
struct FlatRange {
  int64_t begin = 0, end = 0, padded = 0;
};
FlatRange ZeroFlatRange(int64_t total, int dp, int dp_rank);

// Builds the layout; an impossible config is InvalidArgument naming the rule.
Result<Layout> MakeLayout(const Model& model, const ParallelConfig& config);

// The local name of a global parameter path on a stage whose first layer is `first`.
std::string LocalName(const Model& model, const std::string& path, int first_layer);

// Spec §6 JSON; `extra` adds "config", per-rank "bytes" and "padding" fields.
std::string LayoutToJson(const Layout& layout, bool extra = true);
// A table a person reads: one line per rank with tensor count and bytes.
std::string LayoutToText(const Model& model, const Layout& layout);

}  // namespace tenplex
