// A transport in a child process, for two-process tests and benchmarks.
//
// The child is any program that prints its transport address as the first line of its
// stdout and serves until its stdin closes (ServeUntilStdinCloses below does exactly
// that; tenplex_transport_peer and `transport_bench --serve` call it).
//
// Thread-safety: a PeerProcess is used by one thread at a time, except Signal.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "tenplex/transport/transport.h"
#include "tenplex/util/status.h"

namespace tenplex::transport {

class PeerProcess {
 public:
  // Runs argv (argv[0] is the program's path) and reads its address line (Unavailable
  // when none comes within `wait`).
  static Result<std::unique_ptr<PeerProcess>> Start(
      const std::vector<std::string>& argv,
      std::chrono::milliseconds wait = std::chrono::seconds(30));
  // Closes the child's stdin, waits up to 2 s for it to exit, then kills it.
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // kill(pid, sig) while the child was not reaped.
  void Signal(int sig);

 private:
  PeerProcess() = default;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  std::string address_;
};

// Creates a transport of `kind` serving pattern regions (pattern.h) and the probe,
// writes its address and a newline to `out`, and serves until `in` reaches EOF.
Status ServeUntilStdinCloses(std::string_view kind, const TransportOptions& options,
                             std::ostream& out, std::istream& in);

}  // namespace tenplex::transport
