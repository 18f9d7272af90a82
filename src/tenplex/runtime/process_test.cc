// FreePort: a port the workers can bind, below the kernel's ephemeral range (where an
// outgoing connection could take it first), against the range the kernel reports.
#include "tenplex/runtime/process.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>

namespace tenplex::runtime {
namespace {

TEST(FreePort, BelowTheEphemeralRangeAndBindable) {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  const bool known = static_cast<bool>(f >> lo >> hi) && lo > 4096;
  std::set<int> seen;
  for (int i = 0; i < 20; ++i) {
    Result<int> port = FreePort();
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    ASSERT_GT(*port, 0);
    if (known) {
      EXPECT_LT(*port, lo) << "inside the ephemeral range [" << lo << ", " << hi << "]";
      EXPECT_GE(*port, std::max(1024, lo - 16384));
    }
    seen.insert(*port);
    // What a worker's TCPStore does with it: listen on every interface.
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(*port));
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << "port " << *port;
    ::close(fd);
  }
  EXPECT_GT(seen.size(), 1U) << "the same port every time";
}

}  // namespace
}  // namespace tenplex::runtime
