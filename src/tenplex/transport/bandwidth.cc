#include "tenplex/transport/bandwidth.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "tenplex/util/fd.h"

namespace tenplex::transport {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

double MeasureMemcpyBandwidth(uint64_t bytes, int repeats) {
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int i = 0; i < std::max(repeats, 1); ++i) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const auto t1 = Clock::now();
    // Keep the copy observable.
    a[i % bytes] = static_cast<uint8_t>(b[(i * 7919) % bytes] + 1);
    best = std::max(best, static_cast<double>(bytes) / Seconds(t0, t1) / 1e9);
  }
  return best;
}

Result<double> MeasureTcpLoopbackBandwidth(uint64_t bytes, int repeats) {
  Fd listener{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (!listener.valid()) return ErrnoError("socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener.get(), 1) != 0 ||
      ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return ErrnoError("tcp loopback listener", errno);
  }
  Fd sender{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (!sender.valid() ||
      ::connect(sender.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoError("tcp loopback connect", errno);
  }
  Fd receiver{::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC)};
  if (!receiver.valid()) return ErrnoError("tcp loopback accept", errno);
  const int n = std::max(repeats, 1);
  const std::size_t chunk = std::min<uint64_t>(bytes, 4 << 20);
  bool send_failed = false;
  std::thread writer([&] {
    std::vector<uint8_t> buf(chunk, 7);
    for (uint64_t left = bytes * n; left > 0;) {
      const ssize_t w =
          ::send(sender.get(), buf.data(), std::min<uint64_t>(left, chunk), MSG_NOSIGNAL);
      if (w <= 0) {
        send_failed = true;
        return;
      }
      left -= static_cast<uint64_t>(w);
    }
  });
  std::vector<uint8_t> buf(chunk);
  double best = 0;
  Status status;
  for (int i = 0; i < n && status.ok(); ++i) {
    const auto t0 = Clock::now();
    for (uint64_t left = bytes; left > 0;) {
      const ssize_t r = ::recv(receiver.get(), buf.data(), std::min<uint64_t>(left, chunk), 0);
      if (r <= 0) {
        status = ErrnoError("tcp loopback recv", r < 0 ? errno : ECONNRESET);
        break;
      }
      left -= static_cast<uint64_t>(r);
    }
    best = std::max(best, static_cast<double>(bytes) / Seconds(t0, Clock::now()) / 1e9);
  }
  if (!status.ok()) ::shutdown(receiver.get(), SHUT_RDWR);
  writer.join();
  if (!status.ok()) return status;
  if (send_failed) return Internal("tcp loopback send failed");
  return best;
}

Result<double> MeasureFetchBandwidth(Transport& transport, PeerId peer,
                                     const FetchBandwidthOptions& options) {
  std::vector<uint8_t> buf(options.bytes);
  ReadRequest r{std::string(kProbeRegion), {}, options.capability};
  const uint64_t run = options.run_bytes == 0 ? kProbeRegionBytes : options.run_bytes;
  const uint64_t stride = options.run_bytes == 0 ? kProbeRegionBytes : 2 * options.run_bytes;
  if (run > kProbeRegionBytes / 2 && options.run_bytes != 0) {
    return InvalidArgument("runs of " + std::to_string(run) + " bytes do not fit the probe region");
  }
  uint64_t remote = 0;
  for (uint64_t at = 0; at < options.bytes;) {
    const uint64_t len = std::min(run, options.bytes - at);
    if (remote + len > kProbeRegionBytes) remote = 0;
    r.runs.push_back({remote, len, buf.data() + at});
    at += len;
    remote += stride;
  }
  double best = 0;
  for (int i = 0; i < std::max(options.repeats, 1); ++i) {
    std::fill(buf.begin(), buf.end(), 0);
    const auto t0 = Clock::now();
    TP_RETURN_IF_ERROR(transport.Fetch(peer, {r}));
    best = std::max(best, static_cast<double>(options.bytes) / Seconds(t0, Clock::now()) / 1e9);
    for (const ReadRun& q : r.runs) {
      const uint8_t* d = static_cast<const uint8_t*>(q.dest);
      for (uint64_t k = 0; k < q.length; k += 4093) {
        if (d[k] != ProbeByte(q.offset + k)) {
          return DataLoss("probe byte " + std::to_string(q.offset + k) + " arrived wrong");
        }
      }
    }
  }
  return best;
}

}  // namespace tenplex::transport
