#include "tenplex/transport/box_reads.h"

#include <algorithm>

namespace tenplex::transport {

Status AppendBoxReads(const Shape& remote_shape, const Box& remote_box, uint64_t remote_offset,
                      const MutRegion& dst, std::size_t elem_size, std::vector<ReadRun>* runs) {
  TP_ASSIGN_OR_RETURN(const CopyRuns plan,
                      PlanCopyRuns(remote_shape, remote_box, dst.shape, dst.box, elem_size));
  char* const base = static_cast<char*>(dst.data);
  const uint64_t run = static_cast<uint64_t>(plan.run_bytes);
  // Room for this box's runs, growing geometrically: a region read for several boxes
  // appends to the same runs, and an exact reserve each time would copy them each time.
  const std::size_t need = runs->size() + static_cast<std::size_t>(plan.count);
  if (need > runs->capacity()) runs->reserve(std::max(need, 2 * runs->capacity()));
  plan.ForEach(0, plan.count, [&](int64_t so, int64_t dof) {
    runs->push_back(ReadRun{remote_offset + static_cast<uint64_t>(so), run, base + dof});
  });
  return Status::Ok();
}

}  // namespace tenplex::transport
