#include "tenplex/transport/peer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>

#include "tenplex/transport/pattern.h"

extern char** environ;

namespace tenplex::transport {
namespace {

// True once the child is reaped (pid set to -1).
bool Reap(pid_t* pid, bool block) {
  if (*pid <= 0) return true;
  int st;
  if (::waitpid(*pid, &st, block ? 0 : WNOHANG) == *pid) *pid = -1;
  return *pid <= 0;
}

}  // namespace

Result<std::unique_ptr<PeerProcess>> PeerProcess::Start(const std::vector<std::string>& argv,
                                                        std::chrono::milliseconds wait) {
  if (argv.empty()) return InvalidArgument("no program to start");
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return ErrnoError("pipe", errno);
  if (::pipe2(out, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(in[0]);
    ::close(in[1]);
    return ErrnoError("pipe", err);
  }
  std::unique_ptr<PeerProcess> p(new PeerProcess);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int rc = posix_spawn(&p->pid_, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  p->stdin_fd_ = in[1];
  if (rc != 0) {
    p->pid_ = -1;
    ::close(out[0]);
    return ErrnoError("cannot start " + argv[0], rc);
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  char c;
  bool line = false;
  while (!line && std::chrono::steady_clock::now() < deadline) {
    pollfd pfd{out[0], POLLIN, 0};
    if (::poll(&pfd, 1, 50) <= 0) continue;
    if (::read(out[0], &c, 1) != 1) break;
    if (c == '\n') {
      line = true;
    } else {
      p->address_.push_back(c);
    }
  }
  ::close(out[0]);
  if (!line || p->address_.empty()) {
    return Unavailable(argv[0] + " printed no transport address");
  }
  return p;
}

PeerProcess::~PeerProcess() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  if (pid_ <= 0) return;
  ::kill(pid_, SIGCONT);
  for (int i = 0; i < 100 && !Reap(&pid_, false); ++i) ::usleep(20000);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    Reap(&pid_, true);
  }
}

void PeerProcess::Signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

Status ServeUntilStdinCloses(std::string_view kind, const TransportOptions& options,
                             std::ostream& out, std::istream& in) {
  TP_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, NewTransport(kind, PatternLookup(), options));
  out << t->LocalAddress() << std::endl;
  std::string line;
  while (std::getline(in, line)) {
  }
  return Status::Ok();
}

}  // namespace tenplex::transport
