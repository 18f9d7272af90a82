// A transport serving pattern regions (pattern.h) until its stdin closes: the other
// process of the two-process tests. Prints its address on the first line of stdout.
//   tenplex_transport_peer <inproc|ucx> [ucx_tls]
#include <cstdio>
#include <iostream>
#include <string>

#include "tenplex/transport/pattern.h"
#include "tenplex/transport/transport.h"

int main(int argc, char** argv) {
  using namespace tenplex::transport;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <inproc|ucx> [ucx_tls]\n", argv[0]);
    return 2;
  }
  TransportOptions options;
  if (argc > 2) options.ucx_tls = argv[2];
  auto t = NewTransport(argv[1], PatternLookup(), options);
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
    return 1;
  }
  std::cout << (*t)->LocalAddress() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}
