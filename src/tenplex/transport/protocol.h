// The transport's wire protocol and the pieces both implementations share.
//
// Protocol version 2 (docs/transport.md). Three active messages, little-endian, fixed
// headers whose layout is pinned below by static_assert:
//   kFetchRequest (client -> server), header RequestHeader, payload: run_count pairs
//     (u64 offset, u64 length), then name_length bytes of region name, then
//     capability_length bytes of capability (the request's ReadRequest::capability,
//     checked by the server's RegionLookup). Always sent eager.
//   kFetchData (server -> client), header DataHeader, payload: bytes
//     [stream_offset, stream_offset + payload length) of the request's *stream*, the
//     concatenation of its runs' bytes in order. A request's stream is cut into
//     messages of at most max_message_bytes; each byte is sent exactly once.
//   kFetchStatus (server -> client), header StatusHeader, payload: message text. Sent
//     instead of any data when the request fails (unknown region, run out of range,
//     bad version), and alone (code 0) when the request reads zero bytes.
// A client knows a request is complete when it received every byte of the stream, or
// a status. Changing any of this means a new kProtocolVersion.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tenplex/transport/capability.h"
#include "tenplex/transport/transport.h"
#include "tenplex/util/status.h"

namespace tenplex::transport {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

inline constexpr uint32_t kProtocolVersion = 2;

enum AmId : uint16_t {
  kFetchRequest = 1,
  kFetchData = 2,
  kFetchStatus = 3,
};
static_assert(kFetchRequest == 1 && kFetchData == 2 && kFetchStatus == 3,
              "active message ids are part of the wire protocol");

struct RequestHeader {
  uint32_t version;
  uint32_t run_count;
  uint64_t request_id;
  uint32_t name_length;
  uint32_t capability_length;  // version 1: reserved (0)
};
static_assert(sizeof(RequestHeader) == 24);

struct DataHeader {
  uint32_t version;
  uint32_t reserved;  // 0
  uint64_t request_id;
  uint64_t stream_offset;
};
static_assert(sizeof(DataHeader) == 24);

struct StatusHeader {
  uint32_t version;
  uint32_t code;  // a StatusCode value, 0 = OK
  uint64_t request_id;
};
static_assert(sizeof(StatusHeader) == 16);

// Status codes travel as their numeric values: pin them.
static_assert(static_cast<int>(StatusCode::kOk) == 0 &&
              static_cast<int>(StatusCode::kNotFound) == 2 &&
              static_cast<int>(StatusCode::kOutOfRange) == 4 &&
              static_cast<int>(StatusCode::kUnavailable) == 8 &&
              static_cast<int>(StatusCode::kUnimplemented) == 13);
inline constexpr uint32_t kMaxWireStatusCode = 13;

// Runs per request message (the payload stays below 256 KiB).
inline constexpr uint32_t kMaxRunsPerMessage = 16384;
// Longest region name, capability and status text.
inline constexpr uint32_t kMaxNameLength = 4096;
inline constexpr uint32_t kMaxCapabilityLength = 1024;
inline constexpr uint32_t kMaxStatusText = 4096;

struct WireRun {
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(WireRun) == 16);

// A decoded kFetchRequest.
struct DecodedRequest {
  uint64_t request_id = 0;
  std::string region;
  std::vector<WireRun> runs;
  std::string capability;
};

// The payload of a kFetchRequest for runs[first, first + count).
std::string EncodeRequestPayload(std::string_view region, const ReadRun* runs, uint32_t count,
                                 std::string_view capability = {});
// Checks the header (size, version, limits) and payload against each other.
Result<DecodedRequest> DecodeRequest(const void* header, std::size_t header_length,
                                     const void* payload, std::size_t payload_length);

// A status as sent in kFetchStatus, and back. A code outside the known range decodes
// to DataLoss.
StatusHeader EncodeStatusHeader(uint64_t request_id, const Status& status);
Status DecodeStatus(const StatusHeader& header, std::string_view text);

// Server side: checks that every run lies inside a region of `size` bytes (no
// overflow); OutOfRange naming the first run that does not.
Status CheckRuns(std::string_view region, uint64_t size, const WireRun* runs, std::size_t count);
// Client side: InvalidArgument for a non-empty run with a null destination, a run whose
// end overflows, a region name longer than kMaxNameLength or a capability longer than
// kMaxCapabilityLength.
Status CheckReadRequests(const std::vector<ReadRequest>& requests);

// The bytes of kProbeRegion (built on first use, shared by all transports).
const Region& ProbeRegion();
// lookup(name, capability), or the probe region for kProbeRegion (with probe_key: for
// a valid probe capability only, a refusal counted in probe_refused when given), or
// NotFound when lookup is empty.
Result<Region> FindRegion(const RegionLookup& lookup, std::string_view name,
                          std::string_view capability,
                          const std::optional<std::string>& probe_key = std::nullopt,
                          RefusalCounter* probe_refused = nullptr);

// Stream positions of runs: starts[i] = sum of lengths before run i; starts.back() is
// the stream's length.
template <typename RunT>
std::vector<uint64_t> StreamStarts(const RunT* runs, std::size_t count) {
  std::vector<uint64_t> starts(count + 1, 0);
  for (std::size_t i = 0; i < count; ++i) starts[i + 1] = starts[i] + runs[i].length;
  return starts;
}

// Calls fn(run_index, offset_in_run, length) for the pieces of stream bytes [begin, end)
// in order, skipping empty runs. REQUIRES: begin <= end <= starts.back().
template <typename Fn>
void ForEachPiece(const std::vector<uint64_t>& starts, uint64_t begin, uint64_t end, Fn&& fn) {
  if (begin >= end) return;
  // First run whose end is after begin.
  std::size_t lo = 0, hi = starts.size() - 1;
  while (lo < hi) {
    std::size_t mid = (lo + hi) / 2;
    if (starts[mid + 1] <= begin) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  for (std::size_t i = lo; i + 1 < starts.size() && starts[i] < end; ++i) {
    const uint64_t b = std::max(begin, starts[i]), e = std::min(end, starts[i + 1]);
    if (b < e) fn(i, b - starts[i], e - b);
  }
}

// Cuts runs into consecutive groups of at most max_runs runs and max_bytes bytes each
// (a run longer than max_bytes is split into several runs); the groups' runs, in order,
// read exactly what `runs` reads. No group is empty unless `runs` is (then one empty
// group: a request still checks its region).
std::vector<std::vector<ReadRun>> SplitReads(const std::vector<ReadRun>& runs, uint32_t max_runs,
                                             uint64_t max_bytes);

// How a server cuts a request's stream into data messages: [begin, end) stream
// ranges in order, covering the stream. A run of at least direct_min bytes (or longer
// than the packed limit) is sent on its own (in pieces of at most max_message bytes), so that both
// sides use it in place; consecutive shorter runs are grouped into messages of at most
// min(max_packed, max_message) bytes (packed by the sender, scattered by the receiver).
std::vector<std::pair<uint64_t, uint64_t>> PlanMessages(const std::vector<uint64_t>& starts,
                                                        uint64_t max_message, uint64_t max_packed,
                                                        uint64_t direct_min);

// Address tokens: "<kind>:<hex payload>:<xxh64 of payload, 16 hex digits>".
std::string EncodeAddress(std::string_view kind, std::string_view payload);
// The payload of a token of this kind; InvalidArgument naming what is wrong.
Result<std::string> DecodeAddress(std::string_view kind, std::string_view token);

}  // namespace tenplex::transport
