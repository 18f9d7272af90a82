#include "tenplex/store/parse.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>

#include "tenplex/util/format.h"

namespace tenplex::store {

namespace {

constexpr std::size_t kMaxDigits = 18;  // < 2^63 always

bool IsDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// A non-negative decimal of at most 18 digits.
Result<int64_t> ParseNumber(std::string_view s, std::string_view what) {
  if (!s.empty() && s[0] == '-') {
    return InvalidArgument(std::string(what) + " '" + std::string(s) + "' is negative");
  }
  if (!IsDigits(s)) {
    return InvalidArgument(std::string(what) + " '" + std::string(s) +
                           "' is not a non-negative integer");
  }
  if (s.size() > kMaxDigits) {
    return InvalidArgument(std::string(what) + " '" + std::string(s) + "' is too large");
  }
  int64_t v = 0;
  for (char c : s) v = v * 10 + (c - '0');
  return v;
}

std::vector<std::string_view> Split(std::string_view s, char sep) { return SplitString(s, sep); }

bool IsSegmentChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

// Quotes a piece of user input for an error message, shortened and made printable.
std::string Quote(std::string_view s) {
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < 80; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > 80) out += "...";
  return out + "'";
}

Status SegmentError(std::string_view s, std::string_view what) {
  if (s.empty())
    return InvalidArgument("empty " + std::string(what) + " (a '//' or a trailing '/')");
  if (s == "." || s == "..") {
    return InvalidArgument(std::string(what) + " " + Quote(s) +
                           " is not allowed (no path traversal)");
  }
  if (s.size() > kMaxSegment) {
    return InvalidArgument(std::string(what) + " " + Quote(s) + " is longer than " +
                           std::to_string(kMaxSegment) + " characters");
  }
  return InvalidArgument(std::string(what) + " " + Quote(s) +
                         " may only contain A-Z a-z 0-9 . _ -");
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string TensorPath::Key() const { return RankSegment(rank) + "/" + name; }

std::string TensorPath::WithVersion(uint64_t v) const {
  return "jobs/" + job + "/" + std::to_string(v) + "/" + Key();
}

bool IsValidSegment(std::string_view s) {
  if (s.empty() || s.size() > kMaxSegment || s == "." || s == "..") return false;
  for (char c : s) {
    if (!IsSegmentChar(c)) return false;
  }
  return true;
}

std::string RankSegment(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank-%05d", rank);
  return buf;
}

std::string VersionPrefix(std::string_view job, uint64_t version) {
  return "jobs/" + std::string(job) + "/" + std::to_string(version) + "/";
}

std::string RankPrefix(std::string_view job, uint64_t version, int rank) {
  return VersionPrefix(job, version) + RankSegment(rank) + "/";
}

std::string TensorPathOf(std::string_view job, uint64_t version, int rank, std::string_view name) {
  return RankPrefix(job, version, rank) + std::string(name);
}

Result<int> ParseRankSegment(std::string_view s) {
  constexpr std::string_view kPrefix = "rank-";
  if (s.substr(0, kPrefix.size()) != kPrefix || s.size() > kPrefix.size() + 10 ||
      !IsDigits(s.substr(kPrefix.size()))) {
    return InvalidArgument("rank segment " + Quote(s) +
                           " must be rank-NNNNN (five or more digits)");
  }
  int64_t r = 0;
  for (char c : s.substr(kPrefix.size())) r = r * 10 + (c - '0');
  if (r > 0x7fffffff || RankSegment(static_cast<int>(r)) != s) {
    return InvalidArgument("rank segment " + Quote(s) +
                           " is not canonical (expected rank-%05d of a rank < 2^31)");
  }
  return static_cast<int>(r);
}

Result<VersionRef> ParseVersion(std::string_view s) {
  if (s == "current") return VersionRef();
  if (!IsDigits(s) || s.size() > kMaxDigits || s[0] == '0') {
    return InvalidArgument("version " + Quote(s) +
                           " must be a positive integer without leading zeros or 'current'");
  }
  uint64_t v = 0;
  for (char c : s) v = v * 10 + static_cast<uint64_t>(c - '0');
  return VersionRef(v);
}

Status CheckJobName(std::string_view job) {
  if (!IsValidSegment(job)) return SegmentError(job, "job name");
  return Status::Ok();
}

Result<TensorPath> ParseTensorPath(std::string_view path) {
  if (path.size() > kMaxTargetLength)
    return InvalidArgument("path is longer than " + std::to_string(kMaxTargetLength));
  std::vector<std::string_view> seg = Split(path, '/');
  for (std::string_view s : seg) {
    if (s == "..")
      return InvalidArgument("path " + Quote(path) + " contains '..' (no path traversal)");
  }
  if (seg.size() != 5 || seg[0] != "jobs") {
    return InvalidArgument("path " + Quote(path) +
                           " is not jobs/{job}/{version}/rank-{NNNNN}/{name}");
  }
  TensorPath p;
  TP_RETURN_IF_ERROR(CheckJobName(seg[1]));
  p.job = std::string(seg[1]);
  TP_ASSIGN_OR_RETURN(p.version, ParseVersion(seg[2]));
  TP_ASSIGN_OR_RETURN(p.rank, ParseRankSegment(seg[3]));
  if (!IsValidSegment(seg[4])) return SegmentError(seg[4], "tensor name");
  p.name = std::string(seg[4]);
  return p;
}

Result<ListPrefix> ParseListPrefix(std::string_view prefix) {
  if (prefix.size() > kMaxTargetLength)
    return InvalidArgument("prefix is longer than " + std::to_string(kMaxTargetLength));
  std::vector<std::string_view> seg = Split(prefix, '/');
  ListPrefix out;
  out.partial = std::string(seg.back());
  seg.pop_back();
  if (seg.size() > 4)
    return InvalidArgument("prefix " + Quote(prefix) + " is deeper than a tensor path");
  for (std::size_t i = 0; i < seg.size(); ++i) {
    std::string_view s = seg[i];
    if (i == 0) {
      if (s != "jobs") return InvalidArgument("prefix " + Quote(prefix) + " must start with jobs/");
    } else if (i == 1) {
      TP_RETURN_IF_ERROR(CheckJobName(s));
    } else if (i == 2) {
      TP_RETURN_IF_ERROR(ParseVersion(s).status());
    } else {
      TP_RETURN_IF_ERROR(ParseRankSegment(s).status());
    }
    out.segments.emplace_back(s);
  }
  for (char c : out.partial) {
    if (!IsSegmentChar(c))
      return InvalidArgument("prefix " + Quote(prefix) +
                             " has a character outside A-Z a-z 0-9 . _ -");
  }
  if (out.partial.size() > kMaxSegment) return InvalidArgument("prefix segment is too long");
  return out;
}

Result<Shape> ParseShape(std::string_view text, DType dtype) {
  Shape shape;
  if (!text.empty()) {
    std::vector<std::string_view> parts = Split(text, ',');
    if (parts.size() > kMaxRank) {
      return InvalidArgument("shape has " + std::to_string(parts.size()) + " dimensions (at most " +
                             std::to_string(kMaxRank) + ")");
    }
    for (std::string_view p : parts) {
      auto d = ParseNumber(p, "shape dimension");
      if (!d.ok()) return d.status().WithContext("shape " + Quote(text));
      shape.push_back(*d);
    }
  }
  auto bytes = CheckedVolume(shape, static_cast<int64_t>(DTypeSize(dtype)));
  if (!bytes.ok()) return bytes.status();
  return shape;
}

Result<std::vector<RangeItem>> ParseRange(std::string_view text) {
  std::vector<RangeItem> items;
  if (text.empty()) return items;
  std::vector<std::string_view> parts = Split(text, ',');
  if (parts.size() > kMaxRank) {
    return InvalidArgument("range has " + std::to_string(parts.size()) + " items (at most " +
                           std::to_string(kMaxRank) + ")");
  }
  for (std::string_view p : parts) {
    RangeItem item;
    std::size_t colon = p.find(':');
    auto number = [&](std::string_view s) -> Result<int64_t> {
      auto v = ParseNumber(s, "range bound");
      if (!v.ok()) return v.status().WithContext("range " + Quote(text));
      return *v;
    };
    if (colon == std::string_view::npos) {
      TP_ASSIGN_OR_RETURN(int64_t i, number(p));
      item.begin = i;
      item.end = i + 1;
    } else {
      std::string_view b = p.substr(0, colon), e = p.substr(colon + 1);
      if (e.find(':') != std::string_view::npos) {
        return InvalidArgument("range " + Quote(text) + ": item " + Quote(p) +
                               " has more than one ':'");
      }
      if (!b.empty()) {
        TP_ASSIGN_OR_RETURN(item.begin, number(b));
      }
      if (!e.empty()) {
        TP_ASSIGN_OR_RETURN(item.end, number(e));
      }
    }
    items.push_back(item);
  }
  return items;
}

Result<Box> ResolveRange(const std::vector<RangeItem>& items, const Shape& shape) {
  if (items.size() > shape.size()) {
    return InvalidArgument("range has " + std::to_string(items.size()) +
                           " dimensions but the tensor has rank " + std::to_string(shape.size()) +
                           " (shape [" + ShapeToString(shape) + "])");
  }
  Box box = BoxOf(shape);
  for (std::size_t k = 0; k < items.size(); ++k) {
    int64_t b = items[k].begin.value_or(0);
    int64_t e = items[k].end.value_or(shape[k]);
    if (b > e) {
      return InvalidArgument("range dimension " + std::to_string(k) + ": begin " +
                             std::to_string(b) + " is after end " + std::to_string(e));
    }
    if (e > shape[k]) {
      return OutOfRange("range dimension " + std::to_string(k) + ": [" + std::to_string(b) + ", " +
                        std::to_string(e) + ") lies outside [0, " + std::to_string(shape[k]) +
                        ") of shape [" + ShapeToString(shape) + "]");
    }
    box[k] = Interval{b, e};
  }
  return box;
}

Result<std::string> PercentDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '%') {
      if (i + 2 >= text.size() || HexValue(text[i + 1]) < 0 || HexValue(text[i + 2]) < 0) {
        return InvalidArgument("malformed percent escape in " + Quote(text));
      }
      c = static_cast<char>(HexValue(text[i + 1]) * 16 + HexValue(text[i + 2]));
      i += 2;
    }
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return InvalidArgument("control character in " + Quote(text));
    out += c;
  }
  return out;
}

Result<std::map<std::string, std::string>> ParseQuery(std::string_view query) {
  std::map<std::string, std::string> out;
  if (query.empty()) return out;
  std::vector<std::string_view> parts = Split(query, '&');
  if (parts.size() > kMaxQueryParams) {
    return InvalidArgument("query has " + std::to_string(parts.size()) + " parameters (at most " +
                           std::to_string(kMaxQueryParams) + ")");
  }
  for (std::string_view p : parts) {
    std::size_t eq = p.find('=');
    std::string_view k = p.substr(0, eq);
    std::string_view v = eq == std::string_view::npos ? std::string_view() : p.substr(eq + 1);
    TP_ASSIGN_OR_RETURN(std::string key, PercentDecode(k));
    TP_ASSIGN_OR_RETURN(std::string value, PercentDecode(v));
    if (key.empty())
      return InvalidArgument("query " + Quote(query) + " has a parameter without a name");
    if (out.count(key)) return InvalidArgument("query parameter " + Quote(key) + " is given twice");
    out.emplace(std::move(key), std::move(value));
  }
  return out;
}

Result<Target> ParseTarget(std::string_view target) {
  if (target.size() > kMaxTargetLength) {
    return InvalidArgument("request target is longer than " + std::to_string(kMaxTargetLength) +
                           " bytes");
  }
  std::size_t q = target.find('?');
  Target t;
  TP_ASSIGN_OR_RETURN(t.path, PercentDecode(target.substr(0, q)));
  if (q != std::string_view::npos) {
    std::string_view query = target.substr(q + 1);
    std::size_t hash = query.find('#');
    TP_ASSIGN_OR_RETURN(t.query, ParseQuery(query.substr(0, hash)));
  }
  return t;
}

Status CheckQueryKeys(const std::map<std::string, std::string>& query,
                      const std::vector<std::string_view>& allowed) {
  for (const auto& [k, v] : query) {
    bool ok = false;
    for (std::string_view a : allowed) ok = ok || a == k;
    if (!ok) {
      std::string list;
      for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      return InvalidArgument("unknown query parameter " + Quote(k) +
                             " (allowed: " + (list.empty() ? "none" : list) + ")");
    }
  }
  return Status::Ok();
}

Result<HostPort> ParseHostPort(std::string_view text) {
  HostPort hp;
  std::string_view port;
  if (!text.empty() && text[0] == '[') {
    std::size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgument("address " + Quote(text) + " must be [ipv6]:port");
    }
    hp.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos)
      return InvalidArgument("address " + Quote(text) + " must be host:port");
    hp.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
    if (hp.host.find(':') != std::string::npos) {
      return InvalidArgument("address " + Quote(text) + ": write IPv6 hosts as [addr]:port");
    }
  }
  if (hp.host.empty()) return InvalidArgument("address " + Quote(text) + " has no host");
  for (char c : hp.host) {
    if (!IsSegmentChar(c) && c != ':')
      return InvalidArgument("address " + Quote(text) + " has a bad host");
  }
  if (!IsDigits(port) || port.size() > 5)
    return InvalidArgument("address " + Quote(text) + " has a bad port");
  int p = 0;
  for (char c : port) p = p * 10 + (c - '0');
  if (p > 65535)
    return InvalidArgument("address " + Quote(text) + ": port " + std::string(port) + " > 65535");
  hp.port = p;
  return hp;
}

Result<HostPort> ParseUrl(std::string_view url) {
  constexpr std::string_view kHttp = "http://", kHttps = "https://";
  if (url.substr(0, kHttps.size()) == kHttps) {
    return Unimplemented("https is not supported (" + Quote(url) +
                         "); use http:// with --token on a trusted network");
  }
  if (url.substr(0, kHttp.size()) == kHttp) url.remove_prefix(kHttp.size());
  if (!url.empty() && url.back() == '/') url.remove_suffix(1);
  auto hp = ParseHostPort(url);
  if (!hp.ok()) return hp.status().WithContext("store URL");
  return hp;
}

Result<uint64_t> ParseByteSize(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  std::string_view suffix = text.substr(digits);
  int power = 0;  // of the base
  uint64_t base = 1024;
  bool ok = true;
  if (suffix.size() >= 2 && (suffix[0] == 'e' || suffix[0] == 'E') &&
      suffix.find_first_not_of("0123456789", 1) == std::string_view::npos) {
    // 5e9: an integer times a power of ten (how --max-shard-size's default reads)
    base = 10;
    for (char c : suffix.substr(1)) power = std::min(power * 10 + (c - '0'), 99);
  } else if (!suffix.empty()) {
    static constexpr std::string_view kUnits = "KMGT";  // either case
    const std::size_t at =
        kUnits.find(static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0]))));
    std::string_view rest = suffix.substr(1);
    if (suffix[0] == 'B') {
      ok = rest.empty();
    } else if (at == std::string_view::npos) {
      ok = false;
    } else {
      power = static_cast<int>(at) + 1;
      // 80GB is 80·10^9 bytes, as written; 80G and 80GiB are 80·2^30
      if (rest == "B") base = 1000;
      ok = rest.empty() || rest == "i" || rest == "iB" || rest == "B";
    }
  }
  if (digits == 0 || !ok) {
    return InvalidArgument("size " + Quote(text) +
                           " must be a byte count such as 1073741824, 512M, 8GiB, 80GB or 5e9");
  }
  TP_ASSIGN_OR_RETURN(int64_t v, ParseNumber(text.substr(0, digits), "size"));
  if (power > 18) return InvalidArgument("size " + Quote(text) + " is too large");
  uint64_t unit = 1;
  for (int i = 0; i < power; ++i) unit *= base;
  if (static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / unit)
    return InvalidArgument("size " + Quote(text) + " is too large");
  return static_cast<uint64_t>(v) * unit;
}

bool IsLoopbackHost(std::string_view host) {
  if (host == "localhost" || host == "::1" || host == "0:0:0:0:0:0:0:1") return true;
  constexpr std::string_view kMapped = "::ffff:";
  if (host.substr(0, kMapped.size()) == kMapped) host.remove_prefix(kMapped.size());
  // 127.a.b.c with each part a decimal octet.
  std::vector<std::string_view> parts = Split(host, '.');
  if (parts.size() != 4 || parts[0] != "127") return false;
  for (std::string_view p : parts) {
    if (!IsDigits(p) || p.size() > 3) return false;
    int v = 0;
    for (char c : p) v = v * 10 + (c - '0');
    if (v > 255) return false;
  }
  return true;
}

}  // namespace tenplex::store
