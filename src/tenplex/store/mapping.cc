#include "tenplex/store/mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "tenplex/geometry/copy.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::store {

namespace {

uint64_t PageSize() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

Result<ShmMapping> ShmMapping::Map(const std::string& file, uint64_t offset, uint64_t bytes, bool writable,
                                   bool populate) {
  int fd = ::open(file.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + file, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError("stat " + file, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(file + " is not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (offset > file_size || bytes > file_size - offset) {
    ::close(fd);
    return DataLoss(file + " holds " + std::to_string(file_size) + " bytes, less than the " +
                    std::to_string(offset) + " + " + std::to_string(bytes) + " expected");
  }
  ShmMapping m;
  m.writable_ = writable;
  m.size_ = bytes;
  if (bytes > 0) {
    const uint64_t aligned = offset - offset % PageSize();
    m.map_size_ = bytes + (offset - aligned);
    int flags = MAP_SHARED | (populate ? MAP_POPULATE : 0);
    void* p = ::mmap(nullptr, m.map_size_, PROT_READ | (writable ? PROT_WRITE : 0), flags, fd,
                     static_cast<off_t>(aligned));
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return ErrnoError("mmap " + file, err);
    }
    m.base_ = static_cast<uint8_t*>(p);
    m.data_ = m.base_ + (offset - aligned);
  }
  ::close(fd);
  return m;
}

Result<ShmMapping> ShmMapping::Create(const std::string& file, uint64_t bytes, bool populate) {
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("create " + file, errno);
  auto fail = [&](Status s) {
    ::close(fd);
    ::unlink(file.c_str());
    return s;
  };
  if (bytes > 0) {
    int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc == ENOSPC) {
      return fail(ResourceExhausted("shared memory is full: cannot allocate " + std::to_string(bytes) +
                                    " bytes for " + file));
    }
    if (rc == EOPNOTSUPP || rc == EINVAL) {
      // File systems without fallocate: size the file; pages come on first write.
      if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail(ErrnoError("ftruncate " + file, errno));
    } else if (rc != 0) {
      return fail(ErrnoError("fallocate " + file, rc));
    }
  }
  ::close(fd);
  auto m = Map(file, 0, bytes, /*writable=*/true, populate);
  if (!m.ok()) ::unlink(file.c_str());
  return m;
}

ShmMapping::ShmMapping(ShmMapping&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      map_size_(std::exchange(o.map_size_, 0)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      writable_(o.writable_) {}

ShmMapping& ShmMapping::operator=(ShmMapping&& o) noexcept {
  if (this != &o) {
    Reset();
    base_ = std::exchange(o.base_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    writable_ = o.writable_;
  }
  return *this;
}

ShmMapping::~ShmMapping() { Reset(); }

void ShmMapping::Reset() {
  if (base_) ::munmap(base_, map_size_);
  base_ = nullptr;
  data_ = nullptr;
  map_size_ = size_ = 0;
}

void ShmMapping::Prefault() const {
#if defined(MADV_POPULATE_READ) && defined(MADV_POPULATE_WRITE)
  if (base_) (void)::madvise(base_, map_size_, writable_ ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
#endif
}

void ParallelMemcpy(void* dst, const void* src, std::size_t n) {
  if (n == 0) return;
  const Shape shape{static_cast<int64_t>(n)};
  const Box all = BoxOf(shape);
  // Cannot fail: both regions are the same whole 1-D tensor.
  (void)CopyBox(ConstRegion{src, shape, all}, MutRegion{dst, shape, all}, 1, &ThreadPool::Default());
}

}  // namespace tenplex::store
