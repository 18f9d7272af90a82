// libFuzzer target for the dataset index parsers. The first input byte picks one:
//   0: ParseMegatronIndex(rest after 8 bytes, bin size = those 8 bytes mod 2^20); an
//      accepted index must describe sequences inside the data file and a document
//      index from 0 to n (checked here with loads of our own);
//   1: CheckJsonlOffsets(rest); accepted offsets must be increasing by >= 2 and end at
//      the source size (or one past it);
//   2: BuildJsonlOffsets(rest as a JSONL source); a built index must pass
//      CheckJsonlOffsets and its lines must be the source's non-empty lines.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "tenplex/data/jsonl.h"
#include "tenplex/data/megatron.h"
#include "tenplex/util/fuzz.h"

namespace data = tenplex::data;

namespace {

template <typename T>
T At(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* in, size_t size) {
  if (size < 1) return 0;
  const uint8_t which = in[0] % 3;
  const uint8_t* p = in + 1;
  size -= 1;
  if (which == 0) {
    if (size < 8) return 0;
    const uint64_t bin = At<uint64_t>(p) % (1u << 20);
    p += 8;
    size -= 8;
    auto l = data::ParseMegatronIndex(p, size, bin);
    if (!l.ok()) return 0;
    const uint64_t n = l->num_sequences, d = l->num_document_entries;
    for (uint64_t i = 0; i < n; ++i) {
      const int32_t len = At<int32_t>(p + 34 + 4 * i);
      const int64_t ptr = At<int64_t>(p + 34 + 4 * n + 8 * i);
      tenplex::FuzzRequire(len >= 0 && ptr >= 0 &&
                           uint64_t(ptr) + uint64_t(len) * l->dtype.size <= bin);
    }
    tenplex::FuzzRequire(d >= 1 && At<int64_t>(p + 34 + 12 * n) == 0 &&
                         uint64_t(At<int64_t>(p + 34 + 12 * n + 8 * (d - 1))) == n);
  } else if (which == 1) {
    auto info = data::CheckJsonlOffsets(p, size);
    if (!info.ok()) return 0;
    const uint64_t n = info->num_samples;
    for (uint64_t i = 0; i < n; ++i)
      tenplex::FuzzRequire(At<uint64_t>(p + 32 + 8 * (i + 1)) >= At<uint64_t>(p + 32 + 8 * i) + 2);
    const uint64_t last = At<uint64_t>(p + 32 + 8 * n);
    tenplex::FuzzRequire(last == info->source_bytes + (info->last_line_unterminated ? 1 : 0));
  } else {
    std::string_view src(reinterpret_cast<const char*>(p), size);
    auto offsets = data::BuildJsonlOffsets(src);
    if (!offsets.ok()) return 0;
    auto info =
        data::CheckJsonlOffsets(reinterpret_cast<const uint8_t*>(offsets->data()), offsets->size());
    tenplex::FuzzRequire(info.ok() && info->source_bytes == size);
    const uint8_t* o = reinterpret_cast<const uint8_t*>(offsets->data()) + 32;
    std::string rebuilt;
    for (uint64_t i = 0; i < info->num_samples; ++i) {
      const uint64_t b = At<uint64_t>(o + 8 * i), e = At<uint64_t>(o + 8 * (i + 1)) - 1;
      tenplex::FuzzRequire(e > b && e <= size);
      rebuilt += std::string(src.substr(b, e - b)) + "\n";
    }
    std::string expect(src);
    if (info->last_line_unterminated) expect += "\n";
    tenplex::FuzzRequire(rebuilt == expect);
  }
  return 0;
}
