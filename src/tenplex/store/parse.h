// Pure parsers of the store's names and HTTP parameters. Nothing here touches the
// file system, the network or global state, so every function can be fuzzed
// (parse_fuzz.cc) and every byte of input is checked before use.
//
// Tensor paths (docs/store.md):
//   jobs/{job}/{version}/rank-{r:05d}/{name}
// where job and name are segments of 1..200 characters from [A-Za-z0-9._-], never
// "." or ".."; version is a positive decimal integer without leading zeros (at most
// 18 digits) or the word "current" (the job's committed version); the rank segment is
// exactly what printf("rank-%05d", r) prints for 0 <= r < 2^31.
//
// Ranges (?range=): comma-separated items, one per leading dimension: "b:e" (half
// open), ":" (whole dimension), "b:" (to the end), ":e" (from 0) or "i" (= i:i+1, the
// dimension is kept). Missing trailing dimensions are whole; an empty range is the
// whole tensor. Numbers are non-negative decimals of at most 18 digits.
//
// Shapes (?shape=): comma-separated non-negative decimals, "" is a scalar (rank 0).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/geometry/box.h"
#include "tenplex/geometry/dtype.h"
#include "tenplex/util/status.h"

namespace tenplex::store {

inline constexpr std::size_t kMaxSegment = 200;
inline constexpr std::size_t kMaxRank = 32;  // dimensions of a tensor
inline constexpr std::size_t kMaxQueryParams = 16;
inline constexpr std::size_t kMaxTargetLength = 4096;  // path + query of a request

// A version reference: a number, or nullopt for "current".
using VersionRef = std::optional<uint64_t>;

struct TensorPath {
  std::string job;
  VersionRef version;  // nullopt: "current"
  int rank = 0;
  std::string name;
  // "rank-00003/name": the tensor's key inside its version.
  std::string Key() const;
  // The full path with `v` in place of the version ("jobs/j/7/rank-00003/name").
  std::string WithVersion(uint64_t v) const;
};

// True for a valid job or tensor name segment.
bool IsValidSegment(std::string_view s);
// "rank-00003"
std::string RankSegment(int rank);
// Parses "rank-00003"; anything else (wrong width, sign, overflow) is an error.
Result<int> ParseRankSegment(std::string_view s);
// Parses a version segment ("7" or "current").
Result<VersionRef> ParseVersion(std::string_view s);
// Parses a job name.
Status CheckJobName(std::string_view job);

// Parses a full tensor path.
Result<TensorPath> ParseTensorPath(std::string_view path);

// Path builders, the inverse of ParseTensorPath (arguments are not validated):
// "jobs/<job>/<version>/", "jobs/<job>/<version>/rank-NNNNN/" and
// "jobs/<job>/<version>/rank-NNNNN/<name>".
std::string VersionPrefix(std::string_view job, uint64_t version);
std::string RankPrefix(std::string_view job, uint64_t version, int rank);
std::string TensorPathOf(std::string_view job, uint64_t version, int rank, std::string_view name);

// A list prefix: complete segments (each validated; "current" allowed as the version)
// and a trailing partial segment matched as a string prefix.
struct ListPrefix {
  std::vector<std::string> segments;  // complete segments
  std::string partial;                // the text after the last '/'
};
Result<ListPrefix> ParseListPrefix(std::string_view prefix);

// Parses a shape and checks that its byte size (times the dtype's element size) fits
// in 63 bits.
Result<Shape> ParseShape(std::string_view text, DType dtype);

// A parsed range before it is checked against a shape.
struct RangeItem {
  std::optional<int64_t> begin;  // nullopt: 0
  std::optional<int64_t> end;    // nullopt: the dimension's size
};
Result<std::vector<RangeItem>> ParseRange(std::string_view text);
// The box a range selects in a tensor of `shape`: more items than dimensions is
// InvalidArgument, begin > end is InvalidArgument, end > size is OutOfRange.
Result<Box> ResolveRange(const std::vector<RangeItem>& items, const Shape& shape);

// Decodes %XX escapes; rejects malformed escapes and decoded control bytes
// (< 0x20, 0x7f). '+' stays '+'.
Result<std::string> PercentDecode(std::string_view text);

// Parses "a=1&b=2" (values percent-decoded). Empty keys, repeated keys and more than
// kMaxQueryParams parameters are errors; "a" alone means a="".
Result<std::map<std::string, std::string>> ParseQuery(std::string_view query);

// A request target "/v1/tensors/jobs/x?dtype=F32": the decoded path and the query.
struct Target {
  std::string path;
  std::map<std::string, std::string> query;
};
Result<Target> ParseTarget(std::string_view target);

// Checks that every key of `query` is one of `allowed`.
Status CheckQueryKeys(const std::map<std::string, std::string>& query,
                      const std::vector<std::string_view>& allowed);

// "host:port", "[v6]:port"; port in [0, 65535]. A missing port is an error.
struct HostPort {
  std::string host;  // without brackets
  int port = 0;
};
Result<HostPort> ParseHostPort(std::string_view text);
// "http://host:port[/]" or "host:port"; https is Unimplemented.
Result<HostPort> ParseUrl(std::string_view url);
// A byte count for options: "1073741824", "512M", "8G", "8GiB" (K M G T, Ki..., KiB...
// are powers of 1024), "80GB" (KB MB GB TB are powers of 1000, as written), "5e9" (an
// integer times a power of ten); fractions are not accepted.
Result<uint64_t> ParseByteSize(std::string_view text);

// 127.0.0.0/8, ::1, ::ffff:127.x.y.z and "localhost".
bool IsLoopbackHost(std::string_view host);

}  // namespace tenplex::store
