// Transport bandwidth between two processes against the limits measured in the same run.
//
// The limits: memcpy (one thread) and one raw TCP stream over 127.0.0.1. Then, for the
// in-process transport and for UCX with UCX_TLS=tcp, the UCX default, and shared memory
// (sm; UCX 1.13 needs peer failure detection off for it, see transport.h), a child
// process (this binary with --serve) exposes the probe region and this process fetches
// large boxes of it: contiguous, and strided boxes with 64 KiB and 4 KiB rows. Each row
// prints GB/s (best of R fetches into one buffer) and its ratio to TCP loopback and to
// memcpy, both measured again right after the row (best of R each).
//
//   transport_bench [--mib N] [--repeats R]     (defaults: 256 MiB per fetch, best of 3)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "tenplex/transport/bandwidth.h"
#include "tenplex/transport/peer_process.h"
#include "tenplex/transport/transport.h"

namespace {

using namespace tenplex::transport;

struct Config {
  const char* name;
  const char* kind;
  const char* tls;
  bool detect;
};

TransportOptions OptionsFor(const Config& c) {
  TransportOptions o;
  o.ucx_tls = c.tls;
  o.peer_failure_detection = c.detect;
  o.timeout = std::chrono::seconds(60);
  return o;
}

int Serve(int argc, char** argv) {
  // --serve <tls|-> <detect 0/1>
  if (argc < 4) return 2;
  TransportOptions o;
  o.ucx_tls = std::strcmp(argv[2], "-") == 0 ? "" : argv[2];
  o.peer_failure_detection = std::strcmp(argv[3], "1") == 0;
  tenplex::Status s = ServeUntilStdinCloses("ucx", o, std::cout, std::cin);
  if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--serve") == 0) return Serve(argc, argv);
  uint64_t mib = 256;
  int repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--mib") == 0) {
      mib = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (std::strcmp(argv[i], "--repeats") == 0) {
      repeats = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: %s [--mib N] [--repeats R]\n", argv[0]);
      return 2;
    }
  }
  if (mib == 0 || repeats <= 0) {
    std::fprintf(stderr, "--mib and --repeats must be positive\n");
    return 2;
  }
  const uint64_t bytes = mib << 20;
  const double memcpy_gbps = MeasureMemcpyBandwidth(bytes, repeats);
  auto tcp = MeasureTcpLoopbackBandwidth(bytes, repeats);
  if (!tcp.ok()) {
    std::fprintf(stderr, "tcp loopback: %s\n", tcp.status().ToString().c_str());
    return 1;
  }
  std::printf("limits: memcpy %.2f GB/s, raw TCP loopback %.2f GB/s (%llu MiB, best of %d)\n\n",
              memcpy_gbps, *tcp, static_cast<unsigned long long>(mib), repeats);
  std::printf("%-28s %-12s %8s %8s %10s %9s %9s\n", "transport", "box", "GB/s", "vs tcp",
              "vs memcpy", "tcp GB/s", "memcpy");

  const Config configs[] = {
      {"inproc (memcpy)", "inproc", "", true},
      {"ucx UCX_TLS=tcp", "ucx", "tcp", true},
      {"ucx default TLS", "ucx", "", true},
      {"ucx UCX_TLS=sm (no detect)", "ucx", "sm", false},
  };
  const struct {
    const char* name;
    uint64_t run;
  } boxes[] = {{"contiguous", 0}, {"rows 64KiB", 64 << 10}, {"rows 4KiB", 4 << 10}};
  int failures = 0;
  for (const Config& c : configs) {
    std::unique_ptr<PeerProcess> child;
    std::string address;
    std::unique_ptr<Transport> server;  // in-process only
    if (std::strcmp(c.kind, "ucx") == 0) {
      auto p = PeerProcess::Start(
          {"/proc/self/exe", "--serve", *c.tls ? c.tls : "-", c.detect ? "1" : "0"});
      if (!p.ok()) {
        std::printf("%-28s %s\n", c.name, p.status().ToString().c_str());
        ++failures;
        continue;
      }
      child = std::move(p).value();
      address = child->address();
    } else {
      auto s = NewInProcessTransport(nullptr);
      server = std::move(s).value();
      address = server->LocalAddress();
    }
    {
      auto client = NewTransport(c.kind, nullptr, OptionsFor(c));
      if (!client.ok()) {
        std::printf("%-28s %s\n", c.name, client.status().ToString().c_str());
        ++failures;
        continue;
      }
      auto peer = (*client)->Connect(address);
      for (const auto& box : boxes) {
        // The limits again right beside each measurement (best of R each), so that load
        // from other processes hits both sides of the ratio alike.
        auto gbps = peer.ok() ? MeasureFetchBandwidth(**client, *peer, {bytes, box.run, repeats})
                              : tenplex::Result<double>(peer.status());
        auto t = MeasureTcpLoopbackBandwidth(bytes, repeats);
        const double memcpy_best = MeasureMemcpyBandwidth(bytes, repeats);
        tenplex::Status status = !gbps.ok() ? gbps.status() : t.status();
        const double best = gbps.ok() ? *gbps : 0, tcp_best = t.ok() ? *t : 0;
        if (!status.ok()) {
          std::printf("%-28s %-12s %s\n", c.name, box.name, status.ToString().c_str());
          ++failures;
          continue;
        }
        std::printf("%-28s %-12s %8.2f %8.2f %10.2f %9.2f %9.2f\n", c.name, box.name, best,
                    best / tcp_best, best / memcpy_best, tcp_best, memcpy_best);
        std::fflush(stdout);
      }
    }  // the client goes before its peer process
  }
  return failures == 0 ? 0 : 1;
}
