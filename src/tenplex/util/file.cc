#include "tenplex/util/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

namespace tenplex {

namespace {

// What a non-regular file is, for error messages.
const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

// open(2) + fstat: only a regular file, never blocking on a FIFO.
Result<int> OpenForReading(const std::string& path, bool follow_symlinks) {
  const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow_symlinks ? 0 : O_NOFOLLOW);
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP && !follow_symlinks) {
      return InvalidArgument(path +
                             " is a symbolic link (or a loop of them); only regular "
                             "files are read here");
    }
    if (err == ENXIO) return InvalidArgument(path + " is a socket or device, not a regular file");
    return ErrnoError("open " + path, err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("stat " + path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + " is " + FileKind(st.st_mode) + ", not a regular file");
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

Result<std::string> ReadFd(int fd, const std::string& path) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoError("read " + path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

Result<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + path, errno);
  return ReadFd(fd, path);
}

Result<int> OpenRegularFile(const std::string& path) {
  return OpenForReading(path, /*follow_symlinks=*/false);
}

Result<std::string> ReadRegularFile(const std::string& path) {
  TP_ASSIGN_OR_RETURN(int fd, OpenRegularFile(path));
  return ReadFd(fd, path);
}

Status ReserveFileSpace(int fd, uint64_t bytes, const std::string& path) {
  if (bytes == 0) return Status::Ok();
  const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err == 0 || err == EOPNOTSUPP || err == EINVAL) return Status::Ok();
  if (err == ENOSPC || err == EFBIG || err == EDQUOT) {
    return ResourceExhausted("no space for " + path + " (" + std::to_string(bytes) + " bytes): " +
                             (err == ENOSPC ? "the disk is full" : std::strerror(err)));
  }
  return ErrnoError("reserve " + std::to_string(bytes) + " bytes for " + path, err);
}

Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open directory " + dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) return ErrnoError("fsync directory " + dir, err);
  return Status::Ok();
}

std::string TempNameFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
}

Status WriteFileAtomic(const std::string& path, std::string_view data) {
  return WriteFileAtomicParts(path, {data});
}

namespace {

// Writes every part to fd; the errno of a failed write (0: all written).
int WriteParts(int fd, const std::vector<std::string_view>& parts) {
  for (std::string_view data : parts) {
    std::size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::write(fd, data.data() + off, data.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      off += static_cast<std::size_t>(n);
    }
  }
  return 0;
}

}  // namespace

Status WriteFileAtomicParts(const std::string& path, const std::vector<std::string_view>& parts) {
  // A device or a FIFO (`-o /dev/null`) is written to, never replaced: the rename would
  // put a regular file in place of /dev/null (as root).
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("open " + path, errno);
    const int err = WriteParts(fd, parts);
    ::close(fd);
    return err == 0 ? Status::Ok() : ErrnoError("write " + path, err);
  }
  std::string tmp = TempNameFor(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("create " + tmp, errno);
  auto fail = [&](const char* what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoError(std::string(what) + " " + tmp, err);
  };
  if (int err = WriteParts(fd, parts); err != 0) return fail("write", err);
  if (::fsync(fd) != 0) return fail("fsync", errno);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError("rename " + tmp + " to " + path, err);
  }
  return SyncDir(std::filesystem::path(path).parent_path().string());
}

Result<MappedFile> MappedFile::Open(const std::string& path) {
  TP_ASSIGN_OR_RETURN(int fd, OpenForReading(path, /*follow_symlinks=*/true));
  return FromFd(fd, path);
}

Result<MappedFile> MappedFile::OpenRegular(const std::string& path) {
  TP_ASSIGN_OR_RETURN(int fd, OpenRegularFile(path));
  return FromFd(fd, path);
}

Result<MappedFile> MappedFile::FromFd(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError("stat " + path, err);
  }
  MappedFile m;
  m.path_ = path;
  m.size_ = static_cast<std::size_t>(st.st_size);
  if (m.size_ > 0) {
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return ErrnoError("mmap " + path, err);
    }
    m.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return m;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      path_(std::move(o.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    path_ = std::move(o.path_);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Status PreadExact(int fd, void* buf, uint64_t n, uint64_t offset, const std::string& name) {
  auto* p = static_cast<char*>(buf);
  for (uint64_t done = 0; done < n;) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoError("read " + name, errno);
    if (r == 0) {
      return DataLoss(name + ": ended at " + std::to_string(offset + done) + " bytes, expected " +
                      std::to_string(offset + n));
    }
    done += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Status PwriteExact(int fd, const void* buf, uint64_t n, uint64_t offset, const std::string& name) {
  const auto* p = static_cast<const char*>(buf);
  for (uint64_t done = 0; done < n;) {
    const ssize_t w = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0 && errno == EINTR) continue;
    if ((w < 0 && errno == ENOSPC) || w == 0) {
      return ResourceExhausted("no space left writing " + name);
    }
    if (w < 0) return ErrnoError("write " + name, errno);
    done += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

}  // namespace tenplex
