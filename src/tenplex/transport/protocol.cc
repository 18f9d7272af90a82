#include "tenplex/transport/protocol.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "tenplex/transport/capability.h"

namespace tenplex::transport {

std::string EncodeRequestPayload(std::string_view region, const ReadRun* runs, uint32_t count,
                                 std::string_view capability) {
  std::string out(
      static_cast<std::size_t>(count) * sizeof(WireRun) + region.size() + capability.size(), '\0');
  char* p = out.data();
  for (uint32_t i = 0; i < count; ++i) {
    const WireRun w{runs[i].offset, runs[i].length};
    std::memcpy(p, &w, sizeof(w));
    p += sizeof(w);
  }
  std::memcpy(p, region.data(), region.size());
  if (!capability.empty()) std::memcpy(p + region.size(), capability.data(), capability.size());
  return out;
}

Result<DecodedRequest> DecodeRequest(const void* header, std::size_t header_length,
                                     const void* payload, std::size_t payload_length) {
  if (header_length != sizeof(RequestHeader)) {
    return InvalidArgument("fetch request header of " + std::to_string(header_length) +
                           " bytes, expected " + std::to_string(sizeof(RequestHeader)));
  }
  RequestHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (h.version != kProtocolVersion) {
    return FailedPrecondition("fetch request of protocol version " + std::to_string(h.version) +
                              ", this peer speaks version " + std::to_string(kProtocolVersion));
  }
  if (h.run_count > kMaxRunsPerMessage || h.name_length > kMaxNameLength ||
      h.capability_length > kMaxCapabilityLength) {
    return InvalidArgument("fetch request with " + std::to_string(h.run_count) + " runs, a " +
                           std::to_string(h.name_length) + "-byte name and a " +
                           std::to_string(h.capability_length) +
                           "-byte capability exceeds the limits");
  }
  const uint64_t want =
      uint64_t{h.run_count} * sizeof(WireRun) + h.name_length + h.capability_length;
  if (payload_length != want || (want > 0 && payload == nullptr)) {
    return InvalidArgument("fetch request payload of " + std::to_string(payload_length) +
                           " bytes, its header announces " + std::to_string(want));
  }
  DecodedRequest r;
  r.request_id = h.request_id;
  r.runs.resize(h.run_count);
  const char* p = static_cast<const char*>(payload);
  if (h.run_count > 0) std::memcpy(r.runs.data(), p, h.run_count * sizeof(WireRun));
  r.region.assign(p + h.run_count * sizeof(WireRun), h.name_length);
  r.capability.assign(p + h.run_count * sizeof(WireRun) + h.name_length, h.capability_length);
  return r;
}

StatusHeader EncodeStatusHeader(uint64_t request_id, const Status& status) {
  return StatusHeader{kProtocolVersion, static_cast<uint32_t>(status.code()), request_id};
}

Status DecodeStatus(const StatusHeader& header, std::string_view text) {
  if (header.version != kProtocolVersion) {
    return DataLoss("status message of protocol version " + std::to_string(header.version));
  }
  if (header.code > kMaxWireStatusCode) {
    return DataLoss("status message with unknown code " + std::to_string(header.code));
  }
  if (header.code == 0) return Status::Ok();
  return Status(static_cast<StatusCode>(header.code), std::string(text));
}

Status CheckRuns(std::string_view region, uint64_t size, const WireRun* runs, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    if (runs[i].offset > size || runs[i].length > size - runs[i].offset) {
      return OutOfRange("run " + std::to_string(i) + " [" + std::to_string(runs[i].offset) + ", +" +
                        std::to_string(runs[i].length) + ") is outside region '" +
                        std::string(region) + "' of " + std::to_string(size) + " bytes");
    }
  }
  return Status::Ok();
}

Status CheckReadRequests(const std::vector<ReadRequest>& requests) {
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const ReadRequest& q = requests[r];
    if (q.region.size() > kMaxNameLength) {
      return InvalidArgument("region name of " + std::to_string(q.region.size()) +
                             " bytes is longer than " + std::to_string(kMaxNameLength));
    }
    if (q.capability.size() > kMaxCapabilityLength) {
      return InvalidArgument("capability of " + std::to_string(q.capability.size()) +
                             " bytes is longer than " + std::to_string(kMaxCapabilityLength));
    }
    for (std::size_t i = 0; i < q.runs.size(); ++i) {
      const ReadRun& run = q.runs[i];
      if (run.length > 0 && run.dest == nullptr) {
        return InvalidArgument("run " + std::to_string(i) + " of the read of '" + q.region +
                               "' has no destination");
      }
      if (run.offset + run.length < run.offset) {
        return InvalidArgument("run " + std::to_string(i) + " of the read of '" + q.region +
                               "' overflows");
      }
    }
  }
  return Status::Ok();
}

std::vector<std::vector<ReadRun>> SplitReads(const std::vector<ReadRun>& runs, uint32_t max_runs,
                                             uint64_t max_bytes) {
  max_runs = std::max<uint32_t>(max_runs, 1);
  max_bytes = std::max<uint64_t>(max_bytes, 1);
  std::vector<std::vector<ReadRun>> groups(1);
  uint64_t bytes = 0;
  for (const ReadRun& run : runs) {
    uint64_t done = 0;
    do {
      if (groups.back().size() == max_runs || (bytes == max_bytes && run.length > 0)) {
        groups.emplace_back();
        bytes = 0;
      }
      const uint64_t len = std::min(run.length - done, max_bytes - bytes);
      char* dest = run.dest == nullptr ? nullptr : static_cast<char*>(run.dest) + done;
      groups.back().push_back({run.offset + done, len, dest});
      bytes += len;
      done += len;
    } while (done < run.length);
  }
  return groups;
}

std::vector<std::pair<uint64_t, uint64_t>> PlanMessages(const std::vector<uint64_t>& starts,
                                                        uint64_t max_message, uint64_t max_packed,
                                                        uint64_t direct_min) {
  max_message = std::max<uint64_t>(max_message, 1);
  max_packed = std::clamp<uint64_t>(max_packed, 1, max_message);
  std::vector<std::pair<uint64_t, uint64_t>> out;
  uint64_t group = 0, group_end = 0;  // the open group of short runs: [group, group_end)
  auto flush = [&] {
    if (group_end > group) out.push_back({group, group_end});
    group = group_end;
  };
  for (std::size_t i = 0; i + 1 < starts.size(); ++i) {
    const uint64_t b = starts[i], e = starts[i + 1];
    if (e == b) continue;
    if (e - b >= direct_min || e - b > max_packed) {
      flush();
      for (uint64_t at = b; at < e; at += max_message)
        out.push_back({at, std::min(e, at + max_message)});
      group = group_end = e;
      continue;
    }
    if (e - group > max_packed) flush();
    group_end = e;
  }
  flush();
  return out;
}

const Region& ProbeRegion() {
  static const Region* probe = [] {
    auto bytes = std::make_shared<std::vector<uint8_t>>(kProbeRegionBytes);
    for (uint64_t i = 0; i < kProbeRegionBytes; ++i) (*bytes)[i] = ProbeByte(i);
    return new Region{bytes->data(), kProbeRegionBytes, bytes};
  }();
  return *probe;
}

Result<Region> FindRegion(const RegionLookup& lookup, std::string_view name,
                          std::string_view capability, const std::optional<std::string>& probe_key,
                          RefusalCounter* probe_refused) {
  if (name == kProbeRegion) {
    if (probe_key) TP_RETURN_IF_ERROR(CheckProbeCapability(*probe_key, capability, probe_refused));
    return ProbeRegion();
  }
  if (!lookup) return NotFound("no region '" + std::string(name) + "' (this peer exposes none)");
  return lookup(name, capability);
}

namespace {

constexpr char kHex[] = "0123456789abcdef";

std::string ToHex(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string Checksum(std::string_view payload) {
  const uint64_t h = XXH64(payload.data(), payload.size(), 0);
  std::string out(16, '0');
  for (int i = 0; i < 16; ++i) out[15 - i] = kHex[(h >> (4 * i)) & 15];
  return out;
}

}  // namespace

std::string EncodeAddress(std::string_view kind, std::string_view payload) {
  return std::string(kind) + ":" + ToHex(payload) + ":" + Checksum(payload);
}

Result<std::string> DecodeAddress(std::string_view kind, std::string_view token) {
  const std::size_t a = token.find(':'), b = token.rfind(':');
  if (a == std::string_view::npos || a == b) {
    return InvalidArgument("'" + std::string(token.substr(0, 64)) +
                           "' is not a transport address (kind:hex:checksum)");
  }
  if (token.substr(0, a) != kind) {
    return InvalidArgument("address of kind '" + std::string(token.substr(0, a)) +
                           "' given to a '" + std::string(kind) + "' transport");
  }
  const std::string_view hex = token.substr(a + 1, b - a - 1);
  if (hex.size() % 2 != 0) return InvalidArgument("transport address has an odd hex length");
  std::string payload(hex.size() / 2, '\0');
  for (std::size_t i = 0; i < payload.size(); ++i) {
    const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("transport address has a non-hex digit");
    payload[i] = static_cast<char>(hi * 16 + lo);
  }
  if (token.substr(b + 1) != Checksum(payload)) {
    return InvalidArgument("transport address checksum does not match (truncated or altered)");
  }
  return payload;
}

}  // namespace tenplex::transport
