// Bandwidth probes: the limits a transfer is compared against, measured in the run
// that reports the ratio (DESIGN.md: every speed claim prints a ratio against a limit
// measured in the same run). Each probe returns the best of `repeats` timings, in
// GB/s (1e9 bytes per second).
#pragma once

#include <cstdint>
#include <string>

#include "tenplex/transport/transport.h"
#include "tenplex/util/status.h"

namespace tenplex::transport {

// memcpy of `bytes` between two buffers of this process (one thread).
double MeasureMemcpyBandwidth(uint64_t bytes = 256ull << 20, int repeats = 3);

// One TCP stream over 127.0.0.1 between two threads of this process, `bytes` per
// repetition (the kernel's loopback copy: the limit of any TCP transport on one host).
Result<double> MeasureTcpLoopbackBandwidth(uint64_t bytes = 256ull << 20, int repeats = 3);

struct FetchBandwidthOptions {
  uint64_t bytes = 256ull << 20;  // per Fetch, into one local buffer
  // 0: contiguous runs of the whole probe region. Otherwise a strided box: runs of
  // run_bytes every 2 * run_bytes of the remote region (the left half of each row of a
  // [rows, 2 * run_bytes] byte tensor), packed densely into the buffer.
  uint64_t run_bytes = 0;
  int repeats = 3;
  std::string capability = {};  // a probe capability, for peers that need one
};

// Fetch from peer's probe region (kProbeRegion) through `transport`. The bytes
// fetched are checked (a sample of each run) against ProbeByte: DataLoss if wrong.
Result<double> MeasureFetchBandwidth(Transport& transport, PeerId peer,
                                     const FetchBandwidthOptions& options = {});

}  // namespace tenplex::transport
