#include "tenplex/plan/plan_lists.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <utility>

#include "tenplex/util/thread_pool.h"

namespace tenplex::plan {

void HugePages(const void* data, std::size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

void FinalizeStats(Plan& plan, int num_hosts, std::vector<int64_t> sent,
                   std::vector<int64_t> recv) {
  PlanStats& s = plan.stats;
  s.ops = static_cast<int64_t>(plan.ops.size());
  s.num_hosts = num_hosts;
  s.host_send_bytes = std::move(sent);
  s.host_recv_bytes = std::move(recv);
  for (int64_t b : s.host_send_bytes) s.max_host_send_bytes = std::max(s.max_host_send_bytes, b);
  for (int64_t b : s.host_recv_bytes) s.max_host_recv_bytes = std::max(s.max_host_recv_bytes, b);
}

void JoinInOrder(std::vector<std::vector<CopyOp>>& lists, int threads, bool shift,
                 std::vector<CopyOp>& out) {
  std::vector<std::size_t> start(lists.size() + 1, 0);
  for (std::size_t t = 0; t < lists.size(); ++t) start[t + 1] = start[t] + lists[t].size();
  out.reserve(start.back());
  HugePages(out.data(), out.capacity() * sizeof(CopyOp));
  out.resize(start.back());
  ForEachConcurrently(lists.size(), threads, [&](std::size_t, std::size_t t) {
    CopyOp* to = out.data() + start[t];
    for (CopyOp& op : lists[t]) {
      if (shift && op.src_new) op.after += static_cast<int64_t>(start[t]);
      *to++ = std::move(op);
    }
    std::vector<CopyOp>().swap(lists[t]);
  });
}

void PackInOrder(const std::vector<std::size_t>& slot, const std::vector<std::size_t>& count,
                 std::vector<std::vector<CopyOp>>& spill, int threads, std::vector<CopyOp>& ops) {
  const std::size_t n = count.size();
  bool spilled = false;
  for (std::size_t t = 0; t < n; ++t) spilled = spilled || count[t] > slot[t + 1] - slot[t];
  if (spilled) {  // rare (a need cut into several ops): per-tensor lists, joined
    std::vector<std::vector<CopyOp>> lists(n);
    for (std::size_t t = 0; t < n; ++t) {
      if (count[t] > slot[t + 1] - slot[t]) {
        lists[t] = std::move(spill[t]);
        continue;
      }
      const auto first = ops.begin() + static_cast<std::ptrdiff_t>(slot[t]);
      lists[t].assign(std::make_move_iterator(first),
                      std::make_move_iterator(first + static_cast<std::ptrdiff_t>(count[t])));
    }
    std::vector<CopyOp>().swap(ops);
    JoinInOrder(lists, threads, true, ops);
    return;
  }
  // Every tensor moves to the front or stays: in tensor order, each op's new place is
  // before its old one and no longer holds an op still to move.
  std::size_t at = 0;
  for (std::size_t t = 0; t < n; ++t) {
    for (std::size_t i = 0; i < count[t]; ++i) {
      CopyOp& op = ops[slot[t] + i];
      if (op.src_new) op.after += static_cast<int64_t>(at);
      if (at + i != slot[t] + i) ops[at + i] = std::move(op);
    }
    at += count[t];
  }
  ops.resize(at);
}

}  // namespace tenplex::plan
