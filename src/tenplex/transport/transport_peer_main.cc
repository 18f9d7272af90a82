// A transport serving pattern regions (pattern.h) until its stdin closes: the other
// process of the two-process tests. Prints its address on the first line of stdout.
//   tenplex_transport_peer <inproc|ucx> [ucx_tls]
#include <cstdio>
#include <iostream>

#include "tenplex/transport/peer_process.h"

int main(int argc, char** argv) {
  using namespace tenplex::transport;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <inproc|ucx> [ucx_tls]\n", argv[0]);
    return 2;
  }
  TransportOptions options;
  if (argc > 2) options.ucx_tls = argv[2];
  tenplex::Status s = ServeUntilStdinCloses(argv[1], options, std::cout, std::cin);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
