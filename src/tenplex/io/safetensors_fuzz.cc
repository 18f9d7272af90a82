// libFuzzer target for io::ParseSafetensorsHeader: arbitrary file images must be
// rejected cleanly or parsed into entries that satisfy the documented checks; an
// accepted header re-encoded by EncodeSafetensorsHeader parses to the same entries.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tenplex/io/safetensors.h"
#include "tenplex/util/fuzz.h"

namespace io = tenplex::io;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto h = io::ParseSafetensorsHeader(data, size);
  if (!h.ok()) return 0;
  const uint64_t data_size = size - h->data_offset;
  uint64_t prev_end = 0;
  for (const io::SafetensorsEntry& e : h->tensors) {
    tenplex::FuzzRequire(e.begin <= e.end && e.end <= data_size);
    auto vol = tenplex::CheckedVolume(e.shape, static_cast<int64_t>(tenplex::DTypeSize(e.dtype)));
    tenplex::FuzzRequire(vol.ok());
    tenplex::FuzzRequire(e.bytes() == static_cast<uint64_t>(*vol) * tenplex::DTypeSize(e.dtype));
    if (e.bytes() > 0) {
      tenplex::FuzzRequire(e.begin >= prev_end);
      prev_end = e.end;
    }
  }
  // Round trip through the encoder (only for small data sections).
  std::vector<io::SafetensorsEntry> entries = h->tensors;
  std::string header = io::EncodeSafetensorsHeader(entries, h->metadata);
  uint64_t total = entries.empty() ? 0 : entries.back().end;
  if (total > (1u << 20)) return 0;
  std::string image = header + std::string(total, '\0');
  auto again =
      io::ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(image.data()), image.size());
  tenplex::FuzzRequire(again.ok() && again->tensors.size() == h->tensors.size() &&
                       again->metadata == h->metadata);
  auto by_name = [](std::vector<io::SafetensorsEntry> v) {
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return v;
  };
  std::vector<io::SafetensorsEntry> a = by_name(entries), b = by_name(again->tensors);
  for (std::size_t i = 0; i < a.size(); ++i) {
    tenplex::FuzzRequire(a[i].name == b[i].name && a[i].dtype == b[i].dtype &&
                         a[i].shape == b[i].shape && a[i].bytes() == b[i].bytes());
  }
  return 0;
}
