#include "tenplex/transport/pattern.h"

#include <map>
#include <mutex>
#include <vector>

namespace tenplex::transport {

std::string PatternName(uint64_t seed, uint64_t bytes) {
  return "pattern-" + std::to_string(seed) + "-" + std::to_string(bytes);
}

RegionLookup PatternLookup(uint64_t max_bytes) {
  struct Cache {
    std::mutex mu;
    std::map<std::string, std::shared_ptr<std::vector<uint8_t>>, std::less<>> regions;
  };
  auto cache = std::make_shared<Cache>();
  return [cache, max_bytes](std::string_view name, std::string_view) -> Result<Region> {
    unsigned long long seed = 0, bytes = 0;
    char tail = 0;
    const std::string s(name);
    if (std::sscanf(s.c_str(), "pattern-%llu-%llu%c", &seed, &bytes, &tail) != 2 ||
        s != PatternName(seed, bytes)) {
      return NotFound("no region '" + s + "'");
    }
    if (bytes > max_bytes) return ResourceExhausted("pattern region '" + s + "' is too large");
    std::lock_guard<std::mutex> l(cache->mu);
    auto& slot = cache->regions[s];
    if (!slot) {
      slot = std::make_shared<std::vector<uint8_t>>(bytes);
      for (uint64_t i = 0; i < bytes; ++i) (*slot)[i] = PatternByte(seed, i);
    }
    return Region{slot->data(), bytes, slot};
  };
}

}  // namespace tenplex::transport
