// Local plan executor: applies a plan (planner.h) to tensors in memory, e.g. the
// mapped rank files of a checkpoint (reshard.h) or, per host, the store's buffers.
//
// Buffers are given per (rank, local tensor index) for both layouts; dp replicas may
// share memory. Ops run in plan order (an op with src_layout "new" reads a destination
// an earlier op filled), each as one strided box copy (geometry/copy.h), split across
// the thread pool when large. Destination elements that no piece covers (vocab
// padding rows, the tail of a flat shard) are zeroed.
#pragma once

#include <cstddef>
#include <vector>

#include "tenplex/geometry/box.h"
#include "tenplex/plan/planner.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/util/status.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::transform {

struct ExecuteOptions {
  ThreadPool* pool = nullptr;  // splits copies above parallel_threshold bytes
  std::size_t parallel_threshold = 1 << 20;
  bool copy_kept = true;     // copy plan::Plan::kept regions unless src and dst share memory
  bool zero_padding = true;  // zero destination padding
};

// src[r][i] is the data of old rank r's local tensor i (layout `from`), dst[r][i] that
// of new rank r's local tensor i (layout `to`); each holds Volume(shape) elements of
// the tensor's dtype. A missing buffer that an op needs is InvalidArgument.
Status ExecutePlan(const plan::Plan& plan, const Layout& from, const Layout& to,
                   const std::vector<std::vector<const void*>>& src,
                   const std::vector<std::vector<void*>>& dst, const ExecuteOptions& options = {});

// The elements of t that no piece covers, as disjoint boxes of t (1-D ranges for a
// flat tensor).
std::vector<Box> PaddingBoxes(const LocalTensor& t);

}  // namespace tenplex::transform
