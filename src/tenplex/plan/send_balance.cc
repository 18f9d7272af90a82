#include "tenplex/plan/send_balance.h"

#include <algorithm>

namespace tenplex::plan {

int32_t SendBalance::SetOf(const std::vector<int32_t>& hosts) {
  auto [it, fresh] = set_ids_.try_emplace(hosts, static_cast<int32_t>(heaps_.size()));
  if (fresh) {
    const int32_t set = it->second;
    std::vector<int32_t>& heap = heaps_.emplace_back(hosts);
    std::make_heap(heap.begin(), heap.end(), [this](int32_t a, int32_t b) { return Less(b, a); });
    for (std::size_t i = 0; i < heap.size(); ++i)
      sets_of_host_[heap[i]].push_back({set, static_cast<int32_t>(i)});
  }
  return it->second;
}

int32_t SendBalance::Pick(int32_t set, int32_t except) const {
  const std::vector<int32_t>& heap = heaps_[set];
  if (heap.empty()) return -1;
  if (heap[0] != except) return heap[0];
  // The root is the receiver: the next smallest is one of its children.
  if (heap.size() == 1) return -1;
  if (heap.size() == 2 || Less(heap[1], heap[2])) return heap[1];
  return heap[2];
}

void SendBalance::SiftDown(int32_t set, std::size_t at) {
  std::vector<int32_t>& heap = heaps_[set];
  auto place = [&](std::size_t i, int32_t host) {
    heap[i] = host;
    for (auto& [s, pos] : sets_of_host_[host]) {
      if (s == set) pos = static_cast<int32_t>(i);
    }
  };
  const int32_t host = heap[at];
  for (;;) {
    std::size_t child = 2 * at + 1;
    if (child >= heap.size()) break;
    if (child + 1 < heap.size() && Less(heap[child + 1], heap[child])) ++child;
    if (!Less(heap[child], host)) break;
    place(at, heap[child]);
    at = child;
  }
  place(at, host);
}

std::vector<int32_t> SendBalance::Components() const {
  std::vector<int32_t> parent(heaps_.size());
  for (std::size_t i = 0; i < parent.size(); ++i) parent[i] = static_cast<int32_t>(i);
  auto root = [&](int32_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (const auto& sets : sets_of_host_) {
    for (std::size_t i = 1; i < sets.size(); ++i) {
      const int32_t a = root(sets[0].first), b = root(sets[i].first);
      if (a != b) parent[std::max(a, b)] = std::min(a, b);
    }
  }
  for (std::size_t i = 0; i < parent.size(); ++i) parent[i] = root(static_cast<int32_t>(i));
  return parent;
}

void SendBalance::Charge(int32_t host, int64_t bytes) {
  if (bytes == 0) return;
  sent_[host] += bytes;
  for (const auto& [set, pos] : sets_of_host_[host]) SiftDown(set, static_cast<std::size_t>(pos));
}

}  // namespace tenplex::plan
