#include "tenplex/plan/send_balance.h"

namespace tenplex::plan {

int32_t SendBalance::SetOf(const std::vector<int32_t>& hosts) {
  auto [it, fresh] = set_ids_.try_emplace(hosts, static_cast<int32_t>(sets_.size()));
  if (fresh) {
    sets_.emplace_back();
    for (int32_t h : hosts) {
      sets_.back().insert({sent_[h], h});
      sets_of_host_[h].push_back(it->second);
    }
  }
  return it->second;
}

int32_t SendBalance::Pick(int32_t set, int32_t except) const {
  const auto& s = sets_[set];
  auto it = s.begin();
  if (it != s.end() && it->second == except) ++it;
  return it == s.end() ? -1 : it->second;
}

void SendBalance::Charge(int32_t host, int64_t bytes) {
  if (bytes == 0) return;
  for (int32_t sid : sets_of_host_[host]) {
    sets_[sid].erase({sent_[host], host});
    sets_[sid].insert({sent_[host] + bytes, host});
  }
  sent_[host] += bytes;
}

}  // namespace tenplex::plan
