#include "tenplex/geometry/copy.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace tenplex {
namespace {

std::vector<int64_t> RowMajorStrides(const Shape& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (std::size_t i = shape.size(); i > 0; --i) {
    s[i - 1] = acc;
    acc *= shape[i - 1];
  }
  return s;
}

Status CheckInside(const Shape& shape, const Box& box, const char* side) {
  if (box.rank() != shape.size()) {
    return InvalidArgument(std::string(side) + " box " + ToString(box) + " has rank " +
                           std::to_string(box.rank()) + " but the tensor has rank " +
                           std::to_string(shape.size()));
  }
  if (IsEmpty(box)) return Status::Ok();
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (box[i].begin < 0 || box[i].end > shape[i]) {
      return OutOfRange(std::string(side) + " box " + ToString(box) +
                        " is outside the tensor of shape [" + ShapeToString(shape) + "]");
    }
  }
  return Status::Ok();
}

// Offset of run r: its outer index (row-major over extents) times the strides.
int64_t OuterOffset(const std::vector<int64_t>& extents, const std::vector<int64_t>& strides,
                    int64_t r) {
  int64_t off = 0;
  for (std::size_t k = extents.size(); k > 0; --k) {
    off += (r % extents[k - 1]) * strides[k - 1];
    r /= extents[k - 1];
  }
  return off;
}

}  // namespace

int64_t CopyRuns::SrcOffset(int64_t r) const {
  return src_begin + OuterOffset(extents, src_strides, r);
}

int64_t CopyRuns::DstOffset(int64_t r) const {
  return dst_begin + OuterOffset(extents, dst_strides, r);
}

Result<CopyRuns> PlanCopyRuns(const Shape& src_shape, const Box& src_box, const Shape& dst_shape,
                              const Box& dst_box, std::size_t elem_size) {
  TP_RETURN_IF_ERROR(CheckInside(src_shape, src_box, "source"));
  TP_RETURN_IF_ERROR(CheckInside(dst_shape, dst_box, "destination"));
  const int64_t vol = Volume(src_box);
  if (vol != Volume(dst_box)) {
    return InvalidArgument("source box " + ToString(src_box) + " and destination box " +
                           ToString(dst_box) + " differ in volume");
  }
  CopyRuns p;
  if (vol == 0) return p;
  Shape e_src = src_box.extents(), e_dst = dst_box.extents();
  std::vector<int64_t> s_str = RowMajorStrides(src_shape), d_str = RowMajorStrides(dst_shape);
  const int64_t s0 = FlatOffset(src_shape, src_box), d0 = FlatOffset(dst_shape, dst_box);
  Shape ext;
  if (e_src == e_dst) {
    ext = e_src;
  } else if (e_dst.size() == 1 && IsContiguous(dst_shape, dst_box)) {
    ext = e_src;  // destination is a flat range: dense with the source's extents
    d_str = RowMajorStrides(ext);
  } else if (e_src.size() == 1 && IsContiguous(src_shape, src_box)) {
    ext = e_dst;
    s_str = RowMajorStrides(ext);
  } else {
    return InvalidArgument("source box " + ToString(src_box) + " and destination box " +
                           ToString(dst_box) + " do not correspond (different extents)");
  }
  // Drop dims of extent 1, then grow the run from the inside.
  std::vector<int64_t> oe, os, od;
  for (std::size_t k = 0; k < ext.size(); ++k) {
    if (ext[k] == 1) continue;
    oe.push_back(ext[k]);
    os.push_back(s_str[k]);
    od.push_back(d_str[k]);
  }
  int64_t run = 1;
  while (!oe.empty() && os.back() == run && od.back() == run) {
    run *= oe.back();
    oe.pop_back();
    os.pop_back();
    od.pop_back();
  }
  const int64_t es = static_cast<int64_t>(elem_size);
  p.extents = oe;
  for (int64_t v : os) p.src_strides.push_back(v * es);
  for (int64_t v : od) p.dst_strides.push_back(v * es);
  p.run_bytes = run * es;
  p.count = vol / run;
  p.src_begin = s0 * es;
  p.dst_begin = d0 * es;
  return p;
}

Status CopyBox(const ConstRegion& src, const MutRegion& dst, std::size_t elem_size,
               ThreadPool* pool, std::size_t parallel_threshold) {
  TP_ASSIGN_OR_RETURN(const CopyRuns p,
                      PlanCopyRuns(src.shape, src.box, dst.shape, dst.box, elem_size));
  if (p.count == 0) return Status::Ok();
  const char* const sbase = static_cast<const char*>(src.data);
  char* const dbase = static_cast<char*>(dst.data);
  const std::size_t run = static_cast<std::size_t>(p.run_bytes);
  auto copy_runs = [&](int64_t b, int64_t e) {
    p.ForEach(b, e, [&](int64_t so, int64_t dof) { std::memcpy(dbase + dof, sbase + so, run); });
  };
  const int64_t bytes = p.run_bytes * p.count;
  const int64_t workers = pool ? static_cast<int64_t>(pool->size()) + 1 : 1;
  if (!pool || bytes < static_cast<int64_t>(parallel_threshold) || workers <= 1) {
    copy_runs(0, p.count);
    return Status::Ok();
  }
  if (p.count >= workers) {
    // Chunks of whole runs, a few per worker for balance.
    const int64_t chunks = std::min<int64_t>(p.count, workers * 4);
    pool->ParallelFor(static_cast<std::size_t>(chunks), [&](std::size_t c) {
      copy_runs(p.count * static_cast<int64_t>(c) / chunks,
                p.count * static_cast<int64_t>(c + 1) / chunks);
    });
    return Status::Ok();
  }
  // Few long runs: cut each run into byte chunks.
  const int64_t per_run = std::max<int64_t>(1, workers * 2 / p.count);
  const int64_t chunks = p.count * per_run;
  pool->ParallelFor(static_cast<std::size_t>(chunks), [&](std::size_t c) {
    int64_t r = static_cast<int64_t>(c) / per_run, part = static_cast<int64_t>(c) % per_run;
    int64_t b = p.run_bytes * part / per_run, e = p.run_bytes * (part + 1) / per_run;
    std::memcpy(dbase + p.DstOffset(r) + b, sbase + p.SrcOffset(r) + b,
                static_cast<std::size_t>(e - b));
  });
  return Status::Ok();
}

Status ZeroBox(const MutRegion& dst, std::size_t elem_size) {
  TP_RETURN_IF_ERROR(CheckInside(dst.shape, dst.box, "destination"));
  for (const Box& part : ContiguousParts(dst.shape, dst.box)) {
    std::memset(static_cast<char*>(dst.data) + FlatOffset(dst.shape, part) * elem_size, 0,
                static_cast<std::size_t>(Volume(part)) * elem_size);
  }
  return Status::Ok();
}

}  // namespace tenplex
