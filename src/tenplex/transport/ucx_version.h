// The UCX library a process runs against (cmake/ucx.cmake, docs/reliability.md).
//
// The build links libucp.so.0 of the project's libucx wheel by RPATH; a process whose loader
// finds another libucp.so.0 first (the system's, through LD_LIBRARY_PATH) would run an older
// UCX than the headers it was built with. UcxTransport::Init refuses that, and a test checks
// that the running UCX is at least kUcxNoPurgeAssertion, the first release whose endpoint
// failure cannot abort the process on a pending wireup reply (UCX 1.13's ucp_request.c:684
// assertion, hit by a data-plane client that dies mid-wireup).
#pragma once

#include <string>

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

}  // namespace tenplex::transport::ucx
