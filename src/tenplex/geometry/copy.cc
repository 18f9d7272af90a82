#include "tenplex/geometry/copy.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace tenplex {
namespace {

struct Plan {
  std::vector<int64_t> ext;  // outer dims, outermost first
  std::vector<int64_t> ss;   // source strides in bytes for outer dims
  std::vector<int64_t> ds;   // destination strides in bytes
  int64_t run = 0;           // bytes per contiguous run
  int64_t runs = 0;          // number of runs
  const char* src = nullptr;
  char* dst = nullptr;
};

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

// Runs [first, last) of the plan.
void RunRange(const Plan& p, int64_t first, int64_t last) {
  const std::size_t n = p.ext.size();
  std::vector<int64_t> idx(n, 0);
  int64_t rem = first;
  int64_t soff = 0, doff = 0;
  for (std::size_t k = n; k > 0; --k) {
    idx[k - 1] = rem % p.ext[k - 1];
    rem /= p.ext[k - 1];
    soff += idx[k - 1] * p.ss[k - 1];
    doff += idx[k - 1] * p.ds[k - 1];
  }
  for (int64_t r = first; r < last; ++r) {
    std::memcpy(p.dst + doff, p.src + soff, static_cast<std::size_t>(p.run));
    for (std::size_t k = n; k > 0; --k) {
      soff += p.ss[k - 1];
      doff += p.ds[k - 1];
      if (++idx[k - 1] < p.ext[k - 1]) break;
      soff -= p.ss[k - 1] * p.ext[k - 1];
      doff -= p.ds[k - 1] * p.ext[k - 1];
      idx[k - 1] = 0;
    }
  }
}

}  // namespace

Status CopyBox(const ConstRegion& src, const MutRegion& dst, std::size_t elem_size,
               ThreadPool* pool, std::size_t parallel_threshold) {
  TP_RETURN_IF_ERROR(CheckInside(src.shape, src.box, "source"));
  TP_RETURN_IF_ERROR(CheckInside(dst.shape, dst.box, "destination"));
  const int64_t vol = Volume(src.box);
  if (vol != Volume(dst.box)) {
    return InvalidArgument("source box " + ToString(src.box) + " and destination box " +
                           ToString(dst.box) + " differ in volume");
  }
  if (vol == 0) return Status::Ok();
  Shape e_src = src.box.extents(), e_dst = dst.box.extents();
  std::vector<int64_t> s_str = RowMajorStrides(src.shape), d_str = RowMajorStrides(dst.shape);
  const int64_t s0 = FlatOffset(src.shape, src.box), d0 = FlatOffset(dst.shape, dst.box);
  Shape ext;
  if (e_src == e_dst) {
    ext = e_src;
  } else if (e_dst.size() == 1 && IsContiguous(dst.shape, dst.box)) {
    ext = e_src;  // destination is a flat range: dense with the source's extents
    d_str = RowMajorStrides(ext);
  } else if (e_src.size() == 1 && IsContiguous(src.shape, src.box)) {
    ext = e_dst;
    s_str = RowMajorStrides(ext);
  } else {
    return InvalidArgument("source box " + ToString(src.box) + " and destination box " +
                           ToString(dst.box) + " do not correspond (different extents)");
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
  Plan p;
  p.ext = oe;
  for (int64_t v : os) p.ss.push_back(v * es);
  for (int64_t v : od) p.ds.push_back(v * es);
  p.run = run * es;
  p.runs = vol / run;
  p.src = static_cast<const char*>(src.data) + s0 * es;
  p.dst = static_cast<char*>(dst.data) + d0 * es;

  const int64_t bytes = vol * es;
  const int64_t workers = pool ? static_cast<int64_t>(pool->size()) + 1 : 1;
  if (!pool || bytes < static_cast<int64_t>(parallel_threshold) || workers <= 1) {
    RunRange(p, 0, p.runs);
    return Status::Ok();
  }
  if (p.runs >= workers) {
    // Chunks of whole runs, a few per worker for balance.
    const int64_t chunks = std::min<int64_t>(p.runs, workers * 4);
    pool->ParallelFor(static_cast<std::size_t>(chunks), [&](std::size_t c) {
      int64_t b = p.runs * static_cast<int64_t>(c) / chunks;
      int64_t e = p.runs * static_cast<int64_t>(c + 1) / chunks;
      RunRange(p, b, e);
    });
    return Status::Ok();
  }
  // Few long runs: cut each run into byte chunks.
  const int64_t per_run = std::max<int64_t>(1, workers * 2 / p.runs);
  const int64_t chunks = p.runs * per_run;
  pool->ParallelFor(static_cast<std::size_t>(chunks), [&](std::size_t c) {
    int64_t r = static_cast<int64_t>(c) / per_run, part = static_cast<int64_t>(c) % per_run;
    int64_t b = p.run * part / per_run, e = p.run * (part + 1) / per_run;
    Plan q = p;
    q.run = e - b;
    // Offset of run r.
    int64_t rem = r, so = 0, dof = 0;
    for (std::size_t k = q.ext.size(); k > 0; --k) {
      int64_t i = rem % q.ext[k - 1];
      rem /= q.ext[k - 1];
      so += i * q.ss[k - 1];
      dof += i * q.ds[k - 1];
    }
    std::memcpy(q.dst + dof + b, q.src + so + b, static_cast<std::size_t>(e - b));
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
