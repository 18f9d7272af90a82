// The UCX library a process runs against (cmake/ucx.cmake, docs/reliability.md).
//
// The build links libucp.so.0 of the project's libucx wheel by RPATH; a process whose loader
// finds another libucp.so.0 first (the system's, through LD_LIBRARY_PATH) would run an older
// UCX than the headers it was built with. UcxTransport::Init refuses that, and a test checks
// that the running UCX is at least kUcxNoPurgeAssertion, the first release whose endpoint
// failure cannot abort the process on a pending wireup reply (UCX 1.13's ucp_request.c:684
// assertion, hit by a data-plane client that dies mid-wireup).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tenplex/util/status.h"

namespace tenplex::transport::ucx {

struct UcxRelease {
  unsigned major = 0;
  unsigned minor = 0;
  unsigned release = 0;

  std::string ToString() const;
  bool AtLeast(const UcxRelease& other) const;
};

inline constexpr UcxRelease kUcxNoPurgeAssertion{1, 14, 0};

// The release of the libucp this process has loaded (ucp_get_version).
UcxRelease UcxLibraryRelease();

// The release of the UCX headers this build was compiled against (UCP_API_*).
UcxRelease UcxHeaderRelease();

// OK where `library` serves a build against `headers`: the same major release and at
// least the headers' minor one; else FAILED_PRECONDITION naming both.
Status CheckUcxLibrary(const UcxRelease& library, const UcxRelease& headers);

// A UCX setting the transport applies to its configuration (`ucp_config_modify`; the key
// without its UCX_ prefix).
struct UcxSetting {
  std::string key, value;
  bool operator==(const UcxSetting&) const = default;
};

// The TCP segment size the transport sets: UCX's default, 8 KiB, held a fetch over TCP to
// 1.1-1.6 GB/s between two daemons with UCX 1.22 (4.1-4.9 GB/s with UCX 1.13), 256 KiB
// gave 4.0-6.6 GB/s (docs/transport.md, "The TCP segment size").
inline constexpr const char* kUcxTcpSegmentSize = "256k";

// The settings for a transport with these transports and devices (empty: UCX's own
// choice), then UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE at kUcxTcpSegmentSize, each
// left out where `env` (getenv) has the variable: the user's setting wins.
std::vector<UcxSetting> UcxSettings(const std::string& tls, const std::string& net_devices,
                                    const std::function<const char*(const char*)>& env);

}  // namespace tenplex::transport::ucx
