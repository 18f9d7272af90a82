#include "tenplex/runtime/process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "tenplex/util/file.h"

namespace tenplex::runtime {

using nlohmann::json;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

namespace {

class PosixLauncher : public ProcessLauncher {
 public:
  Result<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log) override {
    // Everything the child needs is prepared before fork (no allocation after it).
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return ErrnoError("fork", errno);
    if (pid == 0) {
      ::setpgid(0, 0);
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
      ::_exit(127);
    }
    return pid;
  }
  void Kill(pid_t pid) override { ::kill(-pid, SIGKILL); }
  std::optional<int> TryWait(pid_t pid) override {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    return std::nullopt;
  }
  int Wait(pid_t pid) override {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  }
};

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void OnInterrupt(int sig) { g_interrupted = sig; }
struct sigaction g_old_int {
}, g_old_term{};

}  // namespace

std::unique_ptr<ProcessLauncher> NewProcessLauncher() { return std::make_unique<PosixLauncher>(); }

std::string DescribeExit(int status) {
  return WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                             : "exited with code " + std::to_string(WEXITSTATUS(status));
}

bool ExitedOk(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

namespace {

// Binds a TCP socket to `port` on every interface (0: any free one) and returns the port
// it got, or -1 with errno set.
int BindOnce(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(a);
  int got = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    got = ntohs(a.sin_port);
  const int err = errno;
  ::close(fd);
  errno = err;
  return got;
}

// The lowest port the kernel hands to outgoing connections (ip_local_port_range).
int EphemeralLow() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  return f >> lo >> hi && lo > 4096 ? lo : 32768;
}

}  // namespace

Result<int> FreePort() {
  // Below the ephemeral range: between this check and the workers' bind, no outgoing
  // connection on this machine can be given the port as its local one. Inside the range
  // that happened under load (the rendezvous failed with EADDRINUSE).
  const int hi = EphemeralLow();
  const int lo = std::max(1024, hi - 16384);
  std::mt19937 rng(std::random_device{}());
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int port = lo + static_cast<int>(rng() % static_cast<unsigned>(hi - lo));
    if (BindOnce(port) == port) return port;
  }
  const int any = BindOnce(0);  // the range below is full: any free port
  if (any < 0) return ErrnoError("bind a free port", errno);
  return any;
}

InterruptGuard::InterruptGuard() {
  g_interrupted = 0;
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptGuard::~InterruptGuard() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
}

int InterruptSignal() { return static_cast<int>(g_interrupted); }

LogTail::LogTail(std::string path) : path_(std::move(path)) {
  struct stat st;
  if (::stat(path_.c_str(), &st) == 0) offset_ = st.st_size;
}

std::vector<json> LogTail::Poll() {
  std::vector<json> out;
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::pread(fd, buf, sizeof(buf), offset_);
    if (n <= 0) break;
    offset_ += n;
    partial_.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  std::size_t pos;
  while ((pos = partial_.find('\n')) != std::string::npos) {
    json j = json::parse(partial_.substr(0, pos), nullptr, false);
    partial_.erase(0, pos + 1);
    if (!j.is_discarded() && j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

std::string FileTail(const std::string& path, std::size_t bytes) {
  auto text = ReadFile(path);
  if (!text.ok()) return "";
  return text->size() > bytes ? text->substr(text->size() - bytes) : *text;
}

}  // namespace tenplex::runtime
