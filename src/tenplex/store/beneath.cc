#include "tenplex/store/beneath.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

#include "tenplex/util/hash.h"

namespace tenplex::store {

namespace {

Status LinkRefused(const std::string& root, const std::string& path) {
  return FailedPrecondition(path + ": a symbolic link (or a mount point) on the way from " + root +
                            " (a job, version or rank directory or the file itself was replaced "
                            "by a link); the store never follows links out of its directory");
}

// The fallback without openat2: one openat per component, none followed.
int OpenByComponents(int root_fd, std::string_view rel, int flags, int mode) {
  int dir = ::dup(root_fd);
  while (dir >= 0) {
    const std::size_t slash = rel.find('/');
    if (slash == std::string_view::npos) {
      const int fd = ::openat(dir, std::string(rel).c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
      const int err = errno;
      ::close(dir);
      errno = err;
      return fd;
    }
    const std::string part(rel.substr(0, slash));
    rel.remove_prefix(slash + 1);
    if (part == "..") {
      ::close(dir);
      errno = EXDEV;
      return -1;
    }
    const int next = ::openat(dir, part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int err = errno;
    struct stat st;  // a link there fails as ENOTDIR: say ELOOP, as openat2 does
    if (next < 0 && err == ENOTDIR && ::fstatat(dir, part.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(st.st_mode)) {
      err = ELOOP;
    }
    ::close(dir);
    errno = err;
    dir = next;
  }
  return -1;
}

}  // namespace

Result<Fd> OpenBeneath(const std::string& root, const std::string& path, int flags, int mode) {
  if (path.size() <= root.size() + 1 || path.compare(0, root.size(), root) != 0 ||
      path[root.size()] != '/') {
    return InvalidArgument(path + " is not inside the store's directory " + root);
  }
  const std::string rel = path.substr(root.size() + 1);
  Fd root_fd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (root_fd.get() < 0) return ErrnoError("open " + root, errno);
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  // (O_TMPFILE includes O_DIRECTORY's bit: a mode with O_DIRECTORY alone is EINVAL)
  const bool creates = (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE;
  how.mode = creates ? static_cast<uint64_t>(mode) : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  int fd = static_cast<int>(::syscall(SYS_openat2, root_fd.get(), rel.c_str(), &how, sizeof(how)));
  if (fd < 0 && (errno == ENOSYS || errno == EPERM)) {  // (EPERM: a seccomp filter)
    fd = OpenByComponents(root_fd.get(), rel, flags, mode);
  }
  if (fd >= 0) return Fd(fd);
  const int err = errno;
  if (err == ELOOP || err == EXDEV) return LinkRefused(root, path);
  return ErrnoError("open " + path, err);
}

Result<ParentDir> OpenParentBeneath(const std::string& root, const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash <= root.size()) {
    return InvalidArgument(path + " is not inside a directory of the store's " + root);
  }
  TP_ASSIGN_OR_RETURN(Fd dir, OpenBeneath(root, path.substr(0, slash), O_PATH | O_DIRECTORY));
  return ParentDir{std::move(dir), path.substr(slash + 1)};
}

namespace {

// `file` opened read-only beneath root, refused unless a regular file (O_NONBLOCK: a FIFO
// there does not block the open).
Result<Fd> OpenRegularBeneath(const std::string& root, const std::string& file) {
  TP_ASSIGN_OR_RETURN(Fd fd, OpenBeneath(root, file, O_RDONLY | O_NONBLOCK));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("stat " + file, errno);
  if (!S_ISREG(st.st_mode)) return FailedPrecondition(file + " is not a regular file");
  return fd;
}

}  // namespace

Result<std::string> Xxh64Beneath(const std::string& root, const std::string& file, uint64_t bytes) {
  TP_ASSIGN_OR_RETURN(Fd fd, OpenRegularBeneath(root, file));
  return Xxh64HexOfFile(fd.get(), bytes, file);
}

Result<ShmMapping> MapBeneath(const std::string& root, const std::string& file, uint64_t bytes,
                              bool populate) {
  TP_ASSIGN_OR_RETURN(Fd fd, OpenRegularBeneath(root, file));
  // The very file opened (its descriptor's link in /proc): no second path walk.
  Result<ShmMapping> m = ShmMapping::Map("/proc/self/fd/" + std::to_string(fd.get()), 0, bytes,
                                         /*writable=*/false, populate);
  if (!m.ok()) return m.status().WithContext(file);
  return m;
}

}  // namespace tenplex::store
