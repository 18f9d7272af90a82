#include "tenplex/transport/netif.h"

#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

namespace tenplex::transport {
namespace {

// The loopback interface's name, read independently from getifaddrs' flags.
std::string LoopbackName() {
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return "";
  std::string name;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if ((i->ifa_flags & IFF_LOOPBACK) != 0) {
      name = i->ifa_name;
      break;
    }
  }
  ::freeifaddrs(ifs);
  return name;
}

TEST(NetifTest, LoopbackAddressesMapToTheLoopbackInterface) {
  const std::string lo = LoopbackName();
  ASSERT_FALSE(lo.empty());
  for (const char* host : {"127.0.0.1", "127.0.0.2", "localhost"}) {
    Result<std::string> r = InterfaceOfAddress(host);
    ASSERT_TRUE(r.ok()) << host << ": " << r.status().message();
    EXPECT_EQ(*r, lo) << host;
  }
}

TEST(NetifTest, WildcardMeansEveryInterface) {
  EXPECT_EQ(*InterfaceOfAddress("0.0.0.0"), "");
  EXPECT_EQ(*InterfaceOfAddress("::"), "");
  EXPECT_EQ(*InterfaceOfAddress("[::]"), "");
}

TEST(NetifTest, EveryInterfaceAddressMapsToItsInterface) {
  ifaddrs* ifs = nullptr;
  ASSERT_EQ(::getifaddrs(&ifs), 0);
  int checked = 0;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[64];
    ASSERT_NE(::getnameinfo(i->ifa_addr, sizeof(sockaddr_in), text, sizeof(text), nullptr, 0,
                            NI_NUMERICHOST),
              -1);
    Result<std::string> r = InterfaceOfAddress(text);
    ASSERT_TRUE(r.ok()) << text;
    // Two interfaces may share an address; the one found must hold it.
    bool holds = *r == i->ifa_name;
    for (ifaddrs* j = ifs; j != nullptr && !holds; j = j->ifa_next) {
      if (j->ifa_addr != nullptr && j->ifa_addr->sa_family == AF_INET && *r == j->ifa_name &&
          std::memcmp(&reinterpret_cast<sockaddr_in*>(j->ifa_addr)->sin_addr,
                      &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, 4) == 0)
        holds = true;
    }
    EXPECT_TRUE(holds) << text << " -> " << *r;
    ++checked;
  }
  ::freeifaddrs(ifs);
  EXPECT_GT(checked, 0);
}

TEST(NetifTest, ForeignAddressIsNotFound) {
  // TEST-NET-3 (RFC 5737): documentation only, on no machine's interface.
  Result<std::string> r = InterfaceOfAddress("203.0.113.77");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("203.0.113.77"), std::string::npos);
}

}  // namespace
}  // namespace tenplex::transport
