// The planner's greedy choice of a sending host (step 4 of planner.h): of the hosts
// that hold a box, the one that has sent the fewest cross-host bytes so far, ties broken
// by the lowest host.
//
// Many groups of replicas share one set of holder hosts (every tensor of a pipeline
// stage is held by the same dp replicas), so each distinct host set is kept once as a
// binary min-heap of its hosts by (bytes sent, host), with each host's position in it:
// the choice is the root (or the smaller child of the root, when the root is the
// receiving host itself), and a send, which only increases the sender's key, sifts the
// sender down in every set it belongs to. Cost: O(1) per choice, O(sets of the host ·
// log hosts) per send, independent of the number of groups; no allocation after a set
// is made.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace tenplex::plan {

class SendBalance {
 public:
  explicit SendBalance(int num_hosts) : sent_(num_hosts, 0), sets_of_host_(num_hosts) {}

  // The id of the set of these hosts (ascending, distinct), added when new.
  int32_t SetOf(const std::vector<int32_t>& hosts);

  // The host of set `set` that has sent the fewest bytes so far, skipping host
  // `except`; ties: the lowest host. -1 if none.
  int32_t Pick(int32_t set, int32_t except) const;

  // Host `host` sends `bytes` (>= 0) across hosts.
  void Charge(int32_t host, int64_t bytes);

  // Per set, the id of its component: sets that share a host, directly or through other
  // sets, are in one component, and a send changes the choices of its component only.
  std::vector<int32_t> Components() const;

  // Cross-host bytes each host has sent so far.
  const std::vector<int64_t>& sent() const { return sent_; }

 private:
  bool Less(int32_t a, int32_t b) const {
    return sent_[a] != sent_[b] ? sent_[a] < sent_[b] : a < b;
  }
  // Restores the heap of set `set` below position `at` (its key grew).
  void SiftDown(int32_t set, std::size_t at);

  std::vector<int64_t> sent_;
  std::vector<std::vector<int32_t>> heaps_;  // per set: hosts, a min-heap by Less
  // Per host: (set, the host's position in that set's heap).
  std::vector<std::vector<std::pair<int32_t, int32_t>>> sets_of_host_;
  std::map<std::vector<int32_t>, int32_t> set_ids_;
};

}  // namespace tenplex::plan
