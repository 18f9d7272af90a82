// Files: whole-file reads, atomic writes (temp file, fsync, rename, fsync of the
// directory) and read-only memory maps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/util/status.h"

namespace tenplex {

Result<std::string> ReadFile(const std::string& path);

// Opens a file for reading only if it is a regular file, for files that may be hostile
// (checkpoints): O_NOFOLLOW (a symbolic link, or a loop of them, is refused),
// O_NONBLOCK (a FIFO cannot block the open), then fstat (a FIFO, directory, socket or
// device is refused). Errors name the file and what it is instead. Returns the fd
// (blocking again), owned by the caller.
Result<int> OpenRegularFile(const std::string& path);
// ReadFile through OpenRegularFile.
Result<std::string> ReadRegularFile(const std::string& path);

// Reserves `bytes` of disk for fd (posix_fallocate) before anything is written through a
// memory map or pwrite, so that a full disk is a clean ResourceExhausted naming `path`
// instead of a SIGBUS at the first touch of an unbacked page. File systems without
// fallocate are left to ftruncate (the caller sizes the file).
Status ReserveFileSpace(int fd, uint64_t bytes, const std::string& path);
// Writes data to path + ".tmp.<pid>.<n>", fsyncs, renames onto path, fsyncs the
// directory. A crash leaves either the old file or the new one, never a mix. A path
// that is a device or a FIFO (`-o /dev/null`) is written to in place, never replaced.
Status WriteFileAtomic(const std::string& path, std::string_view data);
// The same for the concatenation of parts (no copy into one buffer).
Status WriteFileAtomicParts(const std::string& path, const std::vector<std::string_view>& parts);
// A unique temporary name beside path: path + ".tmp.<pid>.<n>".
std::string TempNameFor(const std::string& path);
// fsyncs a directory so that renames inside it are durable.
Status SyncDir(const std::string& dir);

// pread of exactly n bytes at offset into buf, retrying EINTR and short reads. A file
// that ends before offset + n is DataLoss naming `name` (it shrank under us, or its
// header promised more than it holds); other errors name `name` and errno.
Status PreadExact(int fd, void* buf, uint64_t n, uint64_t offset, const std::string& name);
// pwrite of exactly n bytes at offset, retrying EINTR and short writes. ENOSPC, or a
// write that makes no progress, is ResourceExhausted naming `name`.
Status PwriteExact(int fd, const void* buf, uint64_t n, uint64_t offset, const std::string& name);

// A read-only private memory map of a whole file. Move-only.
class MappedFile {
 public:
  // Follows symbolic links; refuses anything but a regular file (never blocks on a FIFO).
  static Result<MappedFile> Open(const std::string& path);
  // Through OpenRegularFile: a symbolic link is refused too.
  static Result<MappedFile> OpenRegular(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  static Result<MappedFile> FromFd(int fd, const std::string& path);
  const uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::string path_;
};

}  // namespace tenplex
