// The planner's greedy choice of a sending host (step 4 of planner.h): of the hosts
// that hold a box, the one that has sent the fewest cross-host bytes so far, ties broken
// by the lowest host.
//
// Many groups of replicas share one set of holder hosts (every tensor of a pipeline
// stage is held by the same dp replicas), so each distinct host set is kept once as an
// ordered set of (bytes sent, host): the choice is its first element (or the second,
// when the first is the receiving host itself), and a send moves the sender in every
// set it belongs to. Cost: O(log hosts) per choice, O(sets of the host · log hosts) per
// send, independent of the number of groups.
#pragma once

#include <cstdint>
#include <map>
#include <set>
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

  // Host `host` sends `bytes` across hosts.
  void Charge(int32_t host, int64_t bytes);

  // Cross-host bytes each host has sent so far.
  const std::vector<int64_t>& sent() const { return sent_; }

 private:
  std::vector<int64_t> sent_;
  // The distinct host sets, each ordered by (sent_, host), and the sets each host is in.
  std::vector<std::set<std::pair<int64_t, int32_t>>> sets_;
  std::vector<std::vector<int32_t>> sets_of_host_;
  std::map<std::vector<int32_t>, int32_t> set_ids_;
};

}  // namespace tenplex::plan
