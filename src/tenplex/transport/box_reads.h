// Reads of a strided box: a box of a remote row-major tensor, copied into a local
// region, is the run decomposition of the copy (geometry's PlanCopyRuns) with the
// source side turned into remote offsets. One run per contiguous piece; the number of
// runs is that of CopyBox's memcpy calls for the same copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tenplex/geometry/copy.h"
#include "tenplex/transport/transport.h"
#include "tenplex/util/status.h"

namespace tenplex::transport {

// Appends to `runs` the reads that copy `remote_box` of a remote row-major tensor of
// `remote_shape` (elements of elem_size bytes, stored from byte `remote_offset` of its
// region) into dst.box of the local tensor dst. The boxes must correspond as in CopyBox
// (same extents, or one side a 1-D range of equal volume); errors are CopyBox's.
Status AppendBoxReads(const Shape& remote_shape, const Box& remote_box, uint64_t remote_offset,
                      const MutRegion& dst, std::size_t elem_size, std::vector<ReadRun>* runs);

}  // namespace tenplex::transport
