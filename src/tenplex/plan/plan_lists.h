// Assembling a Plan's lists (planner.cc): the large op arrays, their join in tensor
// order after parallel planning (planner.h, "Parallel"), and the per-host statistics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tenplex/plan/planner.h"

namespace tenplex::plan {

// A hint for a large array written once (the op lists of a large plan): back it with
// transparent huge pages, so that it faults in 2 MiB steps rather than 4 KiB ones
// (page faults dominate on virtual machines). The whole 2 MiB pages inside it only.
void HugePages(const void* data, std::size_t bytes);

// The plan's op count and per-host statistics from the bytes each host sent (to the
// planned hosts) and received.
void FinalizeStats(Plan& plan, int num_hosts, std::vector<int64_t> sent, std::vector<int64_t> recv);

// The lists of every tensor, joined in tensor order into `out` on the threads (each list
// goes to the lists before it; with `shift`, `after` moves by that much), each freed.
void JoinInOrder(std::vector<std::vector<CopyOp>>& lists, int threads, bool shift,
                 std::vector<CopyOp>& out);

// Tensor t's count[t] ops at ops[slot[t] ..), or, when they did not fit there (more than
// slot[t + 1] - slot[t]), in spill[t], packed in tensor order at the front of `ops`
// (`after` shifted by the ops before), which keeps only them.
void PackInOrder(const std::vector<std::size_t>& slot, const std::vector<std::size_t>& count,
                 std::vector<std::vector<CopyOp>>& spill, int threads, std::vector<CopyOp>& ops);

}  // namespace tenplex::plan
