#include "tenplex/transform/executor.h"

#include <algorithm>

#include "tenplex/geometry/copy.h"
#include "tenplex/plan/box_set.h"
#include "tenplex/util/log.h"

namespace tenplex::transform {

using plan::CopyOp;
namespace {

Status CheckBuffers(std::size_t ranks, const Layout& layout, std::size_t got, const char* which) {
  if (got != ranks) {
    return InvalidArgument(std::string(which) + " buffers are given for " + std::to_string(got) +
                           " ranks but the " + "layout has " + std::to_string(layout.world_size()));
  }
  return Status::Ok();
}

template <typename P>
Result<P> BufferOf(const std::vector<std::vector<P>>& bufs, const Layout& layout, int32_t rank,
                   int32_t tensor, const char* which) {
  if (rank < 0 || rank >= layout.world_size() || tensor < 0 ||
      static_cast<std::size_t>(tensor) >= layout.ranks[rank].tensors->size()) {
    // Appended, not `string + which + "..."`: g++ 12 -O2 warns (array-bounds, a false
    // positive) on the temporary chain once the precompiled header changes its inlining.
    std::string msg = "plan refers to a ";
    msg.append(which).append(" tensor outside the layout");
    return InvalidArgument(msg);
  }
  if (static_cast<std::size_t>(tensor) >= bufs[rank].size() || bufs[rank][tensor] == nullptr) {
    std::string msg = "no ";
    msg.append(which).append(" buffer for rank ").append(std::to_string(rank));
    msg.append(" tensor ").append((*layout.ranks[rank].tensors)[tensor].name);
    return InvalidArgument(msg);
  }
  return bufs[rank][tensor];
}

}  // namespace

std::vector<Box> PaddingBoxes(const LocalTensor& t) {
  std::vector<Box> pad;
  if (t.shape.size() == 1) {
    // 1-D (flat shards, biases): sort the covered ranges and take the gaps.
    std::vector<Interval> cov;
    cov.reserve(t.pieces.size());
    for (const Piece& p : t.pieces) {
      if (!IsEmpty(p.local)) cov.push_back(p.local[0]);
    }
    std::sort(cov.begin(), cov.end());
    int64_t at = 0;
    for (const Interval& iv : cov) {
      if (iv.begin > at) pad.push_back(Box({{at, iv.begin}}));
      at = std::max(at, iv.end);
    }
    if (at < t.shape[0]) pad.push_back(Box({{at, t.shape[0]}}));
    return pad;
  }
  if (Volume(t.shape) == 0) return pad;
  pad.push_back(BoxOf(t.shape));
  for (const Piece& p : t.pieces) plan::SubtractFrom(pad, p.local);
  return pad;
}

Status ExecutePlan(const plan::Plan& plan, const Layout& from, const Layout& to,
                   const std::vector<std::vector<const void*>>& src,
                   const std::vector<std::vector<void*>>& dst, const ExecuteOptions& options) {
  TP_RETURN_IF_ERROR(CheckBuffers(from.world_size(), from, src.size(), "source"));
  TP_RETURN_IF_ERROR(CheckBuffers(to.world_size(), to, dst.size(), "destination"));
  if (options.zero_padding) {
    for (const RankLayout& r : to.ranks) {
      for (std::size_t i = 0; i < r.tensors->size(); ++i) {
        const LocalTensor& t = (*r.tensors)[i];
        std::vector<Box> pad = PaddingBoxes(t);
        if (pad.empty()) continue;
        TP_ASSIGN_OR_RETURN(void* d,
                            BufferOf(dst, to, r.rank, static_cast<int32_t>(i), "destination"));
        for (const Box& b : pad) TP_RETURN_IF_ERROR(ZeroBox({d, t.shape, b}, DTypeSize(t.dtype)));
      }
    }
  }
  auto run = [&](const CopyOp& op, bool kept) -> Status {
    const Layout& sl = op.src_new ? to : from;
    const LocalTensor& st = (*sl.ranks.at(op.src_rank).tensors).at(op.src_tensor);
    const LocalTensor& dt = (*to.ranks.at(op.dst_rank).tensors).at(op.dst_tensor);
    const void* s = nullptr;
    if (op.src_new) {
      TP_ASSIGN_OR_RETURN(s, BufferOf(dst, to, op.src_rank, op.src_tensor, "destination"));
    } else {
      TP_ASSIGN_OR_RETURN(s, BufferOf(src, from, op.src_rank, op.src_tensor, "source"));
    }
    TP_ASSIGN_OR_RETURN(void* d, BufferOf(dst, to, op.dst_rank, op.dst_tensor, "destination"));
    if (kept && s == d) return Status::Ok();
    if (st.dtype != dt.dtype) {
      return InvalidArgument("op copies " + st.name + " (" + std::string(DTypeName(st.dtype)) +
                             ") into " + dt.name + " (" + std::string(DTypeName(dt.dtype)) + ")");
    }
    Status status = CopyBox({s, st.shape, op.src}, {d, dt.shape, op.dst}, DTypeSize(dt.dtype),
                            options.pool, options.parallel_threshold);
    if (!status.ok())
      return status.WithContext("copying " + plan.tensors.at(op.tensor) + " " +
                                ToString(op.global));
    ReportProgress(static_cast<uint64_t>(Volume(op.dst)) * DTypeSize(dt.dtype));
    return Status::Ok();
  };
  if (options.copy_kept) {
    for (const CopyOp& op : plan.kept) TP_RETURN_IF_ERROR(run(op, true));
  }
  for (const CopyOp& op : plan.ops) TP_RETURN_IF_ERROR(run(op, false));
  return Status::Ok();
}

}  // namespace tenplex::transform
