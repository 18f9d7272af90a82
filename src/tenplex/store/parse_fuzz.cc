// libFuzzer target for the store's pure parsers (parse.h): paths, list prefixes,
// shapes, ranges, query strings, request targets, addresses and byte sizes. Besides
// "no crash, no sanitizer report" it checks properties: accepted paths round-trip,
// resolved ranges lie inside their shape, decoded text has no control bytes.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tenplex/store/parse.h"
#include "tenplex/util/fuzz.h"

namespace ts = tenplex::store;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);

  if (auto p = ts::ParseTensorPath(in); p.ok()) {
    tenplex::FuzzRequire(ts::IsValidSegment(p->job) && ts::IsValidSegment(p->name));
    if (p->version) {
      tenplex::FuzzRequire(p->WithVersion(*p->version) == in);
      auto again = ts::ParseTensorPath(p->WithVersion(*p->version));
      tenplex::FuzzRequire(again.ok() && again->Key() == p->Key());
    }
    tenplex::FuzzRequire(*ts::ParseRankSegment(ts::RankSegment(p->rank)) == p->rank);
  }
  if (auto lp = ts::ParseListPrefix(in); lp.ok()) {
    tenplex::FuzzRequire(lp->segments.size() <= 4);
    for (const std::string& s : lp->segments) tenplex::FuzzRequire(s != ".." && s != ".");
  }

  // Shapes and ranges: the first bytes pick a dtype and a small shape, the rest is text.
  if (size >= 3) {
    const tenplex::DType dt = tenplex::kAllDTypes[data[0] % 10];
    (void)ts::ParseShape(in.substr(3), dt);
    tenplex::Shape shape;
    for (int k = 0; k < data[1] % 4; ++k) shape.push_back((data[2] >> (2 * k)) & 7);
    if (auto items = ts::ParseRange(in.substr(3)); items.ok()) {
      if (auto box = ts::ResolveRange(*items, shape); box.ok()) {
        tenplex::FuzzRequire(box->rank() == shape.size() &&
                             tenplex::Contains(tenplex::BoxOf(shape), *box));
      }
    }
  }

  if (auto t = ts::ParseTarget(in); t.ok()) {
    for (char c : t->path) tenplex::FuzzRequire(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f);
    tenplex::FuzzRequire(t->query.size() <= ts::kMaxQueryParams);
    constexpr std::string_view kTensors = "/v1/tensors/";
    if (t->path.compare(0, kTensors.size(), kTensors) == 0) {
      (void)ts::ParseTensorPath(std::string_view(t->path).substr(kTensors.size()));
    }
  }
  (void)ts::ParseQuery(in);
  if (auto hp = ts::ParseHostPort(in); hp.ok())
    tenplex::FuzzRequire(hp->port >= 0 && hp->port <= 65535 && !hp->host.empty());
  (void)ts::ParseUrl(in);
  (void)ts::IsLoopbackHost(in);
  (void)ts::ParseByteSize(in);
  return 0;
}
