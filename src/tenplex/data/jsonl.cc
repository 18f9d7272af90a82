#include "tenplex/data/jsonl.h"

#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tenplex/util/log.h"

namespace tenplex::data {

static_assert(std::endian::native == std::endian::little, "index files are little-endian");

namespace {

std::string N(uint64_t v) { return std::to_string(v); }

void Put(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }

uint64_t Get(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

Result<std::string> BuildJsonlOffsets(std::string_view source) {
  std::vector<uint64_t> off;
  uint64_t start = 0;
  while (start < source.size()) {
    const std::size_t nl = source.find('\n', start);
    const uint64_t end = nl == std::string_view::npos ? source.size() : nl;
    std::string_view line = source.substr(start, end - start);
    const uint64_t number = off.size() + 1;
    if (line.empty() || line == "\r") {
      return InvalidArgument("line " + N(number) +
                             " is empty (every line must hold one JSON record)");
    }
    if (!nlohmann::json::accept(line)) {
      return InvalidArgument("line " + N(number) + " is not valid JSON");
    }
    off.push_back(start);
    ReportProgress(end + 1 - start);
    start = end + 1;  // past the newline, or S + 1 for a last line without one
  }
  if (off.empty()) return InvalidArgument("the JSONL file has no records");
  off.push_back(start);
  std::string out(kJsonlMagic);
  out.reserve(kJsonlHeaderBytes + 8 * off.size());
  Put(&out, kJsonlVersion);
  Put(&out, off.size() - 1);
  Put(&out, source.size());
  for (uint64_t v : off) Put(&out, v);
  return out;
}

Result<JsonlOffsetsInfo> CheckJsonlOffsets(const uint8_t* p, std::size_t size) {
  if (size < kJsonlHeaderBytes) return DataLoss("truncated header (" + N(size) + " bytes)");
  if (std::memcmp(p, kJsonlMagic.data(), kJsonlMagic.size()) != 0) {
    return DataLoss("bad magic, not a tenplex JSONL offsets file");
  }
  if (Get(p + 8) != kJsonlVersion) return DataLoss("unsupported version " + N(Get(p + 8)));
  const uint64_t n = Get(p + 16), s = Get(p + 24);
  const uint64_t entries = (size - kJsonlHeaderBytes) / 8;
  if ((size - kJsonlHeaderBytes) % 8 != 0 || entries < 2 || n != entries - 1) {
    return DataLoss("size " + N(size) + " does not match its record count " + N(n));
  }
  if (s == UINT64_MAX) return DataLoss("impossible source size");
  auto off = [&](uint64_t i) { return Get(p + kJsonlHeaderBytes + 8 * i); };
  if (off(0) != 0) return DataLoss("first offset is " + N(off(0)) + ", not 0");
  for (uint64_t i = 0; i < n; ++i) {
    if (off(i + 1) < off(i) + 2 || off(i + 1) > s + 1) {
      return DataLoss("offset of line " + N(i + 1) + " (" + N(off(i + 1)) +
                      ") is not increasing by at least 2 within the source size " + N(s));
    }
  }
  if (off(n) != s && off(n) != s + 1) {
    return DataLoss("last offset " + N(off(n)) + " does not end the " + N(s) + "-byte source");
  }
  return JsonlOffsetsInfo{n, s, off(n) == s + 1};
}

Result<JsonlDataset> JsonlDataset::Open(const std::string& source_path,
                                        const std::string& offsets_path) {
  JsonlDataset d;
  TP_ASSIGN_OR_RETURN(d.offsets_, MappedFile::Open(offsets_path));
  auto info = CheckJsonlOffsets(d.offsets_.data(), d.offsets_.size());
  if (!info.ok()) return info.status().WithContext(offsets_path);
  d.n_ = info->num_samples;
  const uint64_t s = info->source_bytes;
  TP_ASSIGN_OR_RETURN(d.source_, MappedFile::Open(source_path));
  if (d.source_.size() != s) {
    return DataLoss(source_path + " has " + N(d.source_.size()) + " bytes but had " + N(s) +
                    " when indexed: the source changed, rebuild the index");
  }
  const bool ends_with_newline = s > 0 && d.source_.data()[s - 1] == '\n';
  if (info->last_line_unterminated == ends_with_newline) {
    return DataLoss(source_path +
                    ": its final newline does not match the index, rebuild the index");
  }
  return d;
}

uint64_t JsonlDataset::off(uint64_t i) const {
  return Get(offsets_.data() + kJsonlHeaderBytes + 8 * i);
}

Result<std::string_view> JsonlDataset::line(uint64_t i) const {
  if (i >= n_) return OutOfRange("sample " + N(i) + " is out of range (dataset has " + N(n_) + ")");
  const uint64_t begin = off(i), end = off(i + 1) - 1;  // end = the newline's position
  const char* src = reinterpret_cast<const char*>(source_.data());
  if (end < source_.size() && src[end] != '\n') {
    return DataLoss(source_.path() + ": line " + N(i) +
                    " does not end where the index says, rebuild the index");
  }
  return std::string_view(src + begin, end - begin);
}

}  // namespace tenplex::data
