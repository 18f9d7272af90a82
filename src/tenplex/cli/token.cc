// The bearer token of the store daemons, never from the command line (anyone on the
// host reads argv in `ps` or /proc/PID/cmdline): from `--token-file PATH` or the
// environment variable TENPLEX_TOKEN (docs/reliability.md). `--token` is refused.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "tenplex/cli/command.h"

namespace tenplex::cli {

namespace {

constexpr std::size_t kMaxTokenBytes = 4096;

// Visible ASCII only: the token travels in an HTTP header.
Status CheckTokenText(const std::string& token, const std::string& where) {
  if (token.empty()) return InvalidArgument(where + " holds an empty token");
  if (token.size() > kMaxTokenBytes)
    return InvalidArgument(where + " holds more than " + std::to_string(kMaxTokenBytes) + " bytes");
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return InvalidArgument(where +
                             " holds a token with a space, control or non-ASCII character; a "
                             "token is visible ASCII without spaces");
    }
  }
  return Status::Ok();
}

Result<std::string> ReadTokenFile(const std::string& path) {
  const std::string what = "--token-file " + path;
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFound(what + ": no such file");
    return ErrnoError("open " + what, err);
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("stat " + what, errno);
  if (!S_ISREG(st.st_mode)) return InvalidArgument(what + " is not a regular file");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return InvalidArgument(what + " has mode " + mode +
                           ": a token file must not be accessible by group or others "
                           "(chmod 600 " +
                           path + ")");
  }
  if (st.st_size > static_cast<off_t>(kMaxTokenBytes + 2))
    return InvalidArgument(what + " is larger than a token (" + std::to_string(kMaxTokenBytes) +
                           " bytes at most)");
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("read " + what, errno);
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  TP_RETURN_IF_ERROR(CheckTokenText(text, what));
  return text;
}

}  // namespace

void AddTokenOptions(CLI::App* cmd, TokenOptions* o) {
  cmd->add_option("--token-file", o->file,
                  "File holding the daemons' bearer token (mode 0600; default: the environment "
                  "variable TENPLEX_TOKEN)");
  // Refused at parse time (exit 2): a token on the command line is readable by every
  // user of the host in `ps`. Hidden from --help.
  cmd->add_option("--token", o->refused, "")
      ->group("")
      ->check(CLI::Validator(
          [](std::string&) -> std::string {
            // Not a ValidationError: CLI11 would prefix it with the (hidden) option's
            // empty name.
            throw CLI::ArgumentMismatch(
                "--token: a token on the command line is visible to every user of the host "
                "(ps, /proc/PID/cmdline); give it with --token-file PATH (a file of mode "
                "0600) or the environment variable TENPLEX_TOKEN");
          },
          ""));
}

Result<std::string> ResolveToken(const TokenOptions& o) {
  if (!o.file.empty()) return ReadTokenFile(o.file);
  const char* env = std::getenv("TENPLEX_TOKEN");
  if (env == nullptr || *env == '\0') return std::string();
  std::string token = env;
  TP_RETURN_IF_ERROR(CheckTokenText(token, "TENPLEX_TOKEN"));
  return token;
}

}  // namespace tenplex::cli
