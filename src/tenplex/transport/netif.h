// The network interface that holds a listening address, so that the UCX data plane of
// a store daemon is reachable exactly where its HTTP listener is (docs/reliability.md):
// `--listen 127.0.0.1:7480` gives "lo", and the daemon's UCX worker then opens TCP
// sockets on the loopback interface only (UCX_NET_DEVICES=lo).
#pragma once

#include <string>

#include "tenplex/util/status.h"

namespace tenplex::transport {

// The name of the interface that has `host` (a numeric IPv4/IPv6 address or a host
// name resolved to one) as one of its addresses; an address of 127.0.0.0/8 or ::1
// maps to the loopback interface. "" for a wildcard address (0.0.0.0, ::): every
// interface. NotFound when no interface of this machine has the address.
Result<std::string> InterfaceOfAddress(const std::string& host);

}  // namespace tenplex::transport
