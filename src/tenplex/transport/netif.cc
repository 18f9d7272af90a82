#include "tenplex/transport/netif.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <vector>

namespace tenplex::transport {

namespace {

struct Addr {
  int family = AF_UNSPEC;
  unsigned char bytes[16] = {};
};

bool SameAddr(const Addr& a, const sockaddr* sa) {
  if (sa == nullptr || sa->sa_family != a.family) return false;
  if (a.family == AF_INET) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, a.bytes, 4) == 0;
  }
  return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, a.bytes, 16) == 0;
}

bool IsWildcard(const Addr& a) {
  const std::size_t n = a.family == AF_INET ? 4 : 16;
  for (std::size_t i = 0; i < n; ++i)
    if (a.bytes[i] != 0) return false;
  return true;
}

bool IsLoopback(const Addr& a) {
  if (a.family == AF_INET) return a.bytes[0] == 127;
  static const unsigned char kOne[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return std::memcmp(a.bytes, kOne, 16) == 0;
}

Result<std::vector<Addr>> Resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) return NotFound("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  std::vector<Addr> out;
  for (addrinfo* p = res; p != nullptr; p = p->ai_next) {
    Addr a;
    a.family = p->ai_family;
    if (p->ai_family == AF_INET) {
      std::memcpy(a.bytes, &reinterpret_cast<const sockaddr_in*>(p->ai_addr)->sin_addr, 4);
    } else if (p->ai_family == AF_INET6) {
      std::memcpy(a.bytes, &reinterpret_cast<const sockaddr_in6*>(p->ai_addr)->sin6_addr, 16);
    } else {
      continue;
    }
    out.push_back(a);
  }
  ::freeaddrinfo(res);
  if (out.empty()) return NotFound("'" + host + "' has no IPv4 or IPv6 address");
  return out;
}

}  // namespace

Result<std::string> InterfaceOfAddress(const std::string& host) {
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  TP_ASSIGN_OR_RETURN(std::vector<Addr> addrs, Resolve(h));
  for (const Addr& a : addrs) {
    if (IsWildcard(a)) return std::string();
  }
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return ErrnoError("getifaddrs", errno);
  std::string exact, loopback;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    for (const Addr& a : addrs) {
      if (exact.empty() && SameAddr(a, i->ifa_addr)) exact = i->ifa_name;
      if (loopback.empty() && IsLoopback(a) && (i->ifa_flags & IFF_LOOPBACK) != 0)
        loopback = i->ifa_name;
    }
  }
  ::freeifaddrs(ifs);
  if (!exact.empty()) return exact;
  if (!loopback.empty()) return loopback;
  return NotFound("no network interface of this machine has the address '" + h + "'");
}

}  // namespace tenplex::transport
