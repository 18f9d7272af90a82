#include "tenplex/store/mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <utility>

#include "tenplex/geometry/copy.h"
#include "tenplex/util/file.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::store {

namespace {

uint64_t PageSize() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

bool IsSharedFile(const std::string& file) {
  struct stat st;
  return ::stat(file.c_str(), &st) == 0 && st.st_nlink > 1;
}

Result<ShmMapping> ShmMapping::Map(const std::string& file, uint64_t offset, uint64_t bytes,
                                   bool writable, bool populate) {
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
  if (writable && st.st_nlink > 1) {
    // A tensor linked from a committed version (unchanged by a transform): writing it
    // would change the committed bytes (and their cached checksum).
    ::close(fd);
    return FailedPrecondition(file + " is shared with a committed version (a linked, unchanged " +
                              "tensor): it is read-only; allocate the tensor anew to write it");
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
    m.populated_ = populate;
  }
  ::close(fd);
  return m;
}

Status CreateShmFile(const std::string& file, uint64_t bytes, bool allocate) {
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("create " + file, errno);
  auto fail = [&](Status s) {
    ::close(fd);
    ::unlink(file.c_str());
    return s;
  };
  int rc = allocate && bytes > 0 ? ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) : EOPNOTSUPP;
  if (rc == ENOSPC) {
    return fail(ResourceExhausted("shared memory is full: cannot allocate " +
                                  std::to_string(bytes) + " bytes for " + file));
  }
  if (rc == EOPNOTSUPP || rc == EINVAL) {
    // Not asked to, or a file system without fallocate: size the file sparse.
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
      return fail(ErrnoError("ftruncate " + file, errno));
  } else if (rc != 0) {
    return fail(ErrnoError("fallocate " + file, rc));
  }
  ::close(fd);
  return Status::Ok();
}

Result<ShmMapping> ShmMapping::Create(const std::string& file, uint64_t bytes, bool populate) {
  TP_RETURN_IF_ERROR(CreateShmFile(file, bytes, /*allocate=*/true));
  auto m = Map(file, 0, bytes, /*writable=*/true, populate);
  if (!m.ok()) ::unlink(file.c_str());
  return m;
}

ShmMapping::ShmMapping(ShmMapping&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      map_size_(std::exchange(o.map_size_, 0)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      writable_(o.writable_),
      populated_(o.populated_.exchange(false)) {}

ShmMapping& ShmMapping::operator=(ShmMapping&& o) noexcept {
  if (this != &o) {
    Reset();
    base_ = std::exchange(o.base_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    writable_ = o.writable_;
    populated_ = o.populated_.exchange(false);
  }
  return *this;
}

ShmMapping::~ShmMapping() { Reset(); }

void ShmMapping::Reset() {
  if (base_) ::munmap(base_, map_size_);
  base_ = nullptr;
  data_ = nullptr;
  map_size_ = size_ = 0;
  populated_ = false;
}

void ShmMapping::Shrink(uint64_t bytes) {
  if (bytes >= size_) return;
  if (bytes == 0) {
    Reset();
    return;
  }
  const uint64_t page = PageSize();
  const uint64_t used = static_cast<uint64_t>(data_ - base_) + bytes;
  const uint64_t keep = (used + page - 1) / page * page;
  if (keep < map_size_) {
    ::munmap(base_ + keep, map_size_ - keep);
    map_size_ = keep;
  }
  size_ = bytes;
}

void ShmMapping::Prefault() const {
#if defined(MADV_POPULATE_READ) && defined(MADV_POPULATE_WRITE)
  if (base_ && !populated_.load(std::memory_order_acquire) &&
      ::madvise(base_, map_size_, writable_ ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0)
    populated_.store(true, std::memory_order_release);
#endif
}

namespace {

constexpr uint64_t kIoChunk = 16 << 20;

// Runs io(at, n) over [0, size) in kIoChunk chunks on the default pool; io moves one
// chunk whole (PreadExact, PwriteExact). The first error wins.
template <typename F>
Status ChunkedIo(uint64_t size, F io) {
  const std::size_t chunks = static_cast<std::size_t>((size + kIoChunk - 1) / kIoChunk);
  FirstError error;
  auto run = [&](std::size_t i) {
    if (error.failed()) return;
    const uint64_t begin = i * kIoChunk;
    error.Set(io(begin, std::min(size, begin + kIoChunk) - begin));
  };
  if (chunks <= 1) {
    if (chunks == 1) run(0);
  } else {
    ThreadPool::Default().ParallelFor(chunks, run);
  }
  return error.Get();
}

Status WithFile(const std::string& file, int flags, const std::function<Status(int)>& fn) {
  int fd = ::open(file.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + file, errno);
  Status s = fn(fd);
  ::close(fd);
  return s;
}

}  // namespace

Status PwriteFd(int fd, const std::string& name, uint64_t offset, const void* data, uint64_t size) {
  const char* src = static_cast<const char*>(data);
  return ChunkedIo(size, [&](uint64_t at, uint64_t n) {
    return PwriteExact(fd, src + at, n, offset + at, name);
  });
}

Status PwriteAll(const std::string& file, uint64_t offset, const void* data, uint64_t size) {
  return WithFile(file, O_WRONLY, [&](int fd) { return PwriteFd(fd, file, offset, data, size); });
}

Status PreadAll(const std::string& file, uint64_t offset, void* dst, uint64_t size) {
  char* out = static_cast<char*>(dst);
  return WithFile(file, O_RDONLY, [&](int fd) {
    return ChunkedIo(size, [&](uint64_t at, uint64_t n) {
      return PreadExact(fd, out + at, n, offset + at, file);
    });
  });
}

Status TensorSink::Write(const void* data, uint64_t n) {
  if (n > size_ - written_) {
    return InvalidArgument("more than the " + std::to_string(size_) +
                           " bytes that dtype x shape needs");
  }
  TP_RETURN_IF_ERROR(PwriteFd(fd_, name_, written_, data, n));
  written_ += n;
  return Status::Ok();
}

void ParallelMemcpy(void* dst, const void* src, std::size_t n) {
  if (n == 0) return;
  const Shape shape{static_cast<int64_t>(n)};
  const Box all = BoxOf(shape);
  // Cannot fail: both regions are the same whole 1-D tensor.
  (void)CopyBox(ConstRegion{src, shape, all}, MutRegion{dst, shape, all}, 1,
                &ThreadPool::Default());
}

void ParallelZero(void* dst, std::size_t n) {
  constexpr std::size_t kChunk = 16 << 20;
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  auto one = [&](std::size_t i) {
    const std::size_t b = i * kChunk;
    std::memset(static_cast<char*>(dst) + b, 0, std::min(n, b + kChunk) - b);
  };
  if (chunks <= 1) {
    if (chunks == 1) one(0);
  } else {
    ThreadPool::Default().ParallelFor(chunks, one);
  }
}

}  // namespace tenplex::store
