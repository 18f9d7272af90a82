// Shared-memory tensor files and their memory maps. A tensor's bytes are one file in
// the store's shared-memory directory (tmpfs), offset 0, exactly `bytes` long. The
// store and any local process (a training process, `tenplex store load`) map the same
// file with MAP_SHARED, so a hand-off is zero-copy and the bytes outlive the process
// that wrote them.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "tenplex/util/status.h"

namespace tenplex::store {

// A MAP_SHARED map of [offset, offset + bytes) of a file. Move-only; unmaps on
// destruction. A zero-byte map has data() == nullptr.
// True when `file` has more than one hard link: a tensor shared with a committed
// version (Store::Link), which nobody may write.
bool IsSharedFile(const std::string& file);

class ShmMapping {
 public:
  // Maps an existing file; the file must hold at least offset + bytes bytes (checked,
  // so a truncated file is an error here and never a SIGBUS later). `populate`
  // pre-faults the pages (MAP_POPULATE), which is faster for a full write or read.
  // A writable map of a file with more than one hard link (a tensor of an open version
  // linked from a committed one, Store::Link) is FailedPrecondition: it is read-only.
  static Result<ShmMapping> Map(const std::string& file, uint64_t offset, uint64_t bytes,
                                bool writable, bool populate = false);
  // Creates a new file (O_EXCL, mode 0600) of `bytes` bytes with its pages allocated
  // (posix_fallocate, so a full file system is a clean ResourceExhausted error now and
  // not a SIGBUS on a later write) and maps it writable.
  static Result<ShmMapping> Create(const std::string& file, uint64_t bytes, bool populate = false);

  ShmMapping() = default;
  ShmMapping(ShmMapping&& o) noexcept;
  ShmMapping& operator=(ShmMapping&& o) noexcept;
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool writable() const { return writable_; }
  // Pre-faults the page tables of the whole map (MADV_POPULATE_READ/WRITE) so that a
  // following bulk copy runs at memcpy speed; a no-op where the kernel lacks it, and
  // for a map that is populated already (mapped with `populate`, or pre-faulted
  // before): walking its present pages again costs time and takes nothing.
  void Prefault() const;
  bool populated() const { return populated_; }
  // Keeps only the first `bytes` bytes mapped (the file was truncated to them): the
  // pages past them are unmapped. No-op when bytes >= size().
  void Shrink(uint64_t bytes);

 private:
  void Reset();
  uint8_t* base_ = nullptr;  // page-aligned start of the map
  uint64_t map_size_ = 0;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool writable_ = false;
  mutable std::atomic<bool> populated_{false};
};

// Creates a new file (O_EXCL, mode 0600) of `bytes` bytes; with allocate its pages are
// allocated now (posix_fallocate: zero-filled, and a full file system is
// ResourceExhausted here rather than a SIGBUS in a process writing through a map).
Status CreateShmFile(const std::string& file, uint64_t bytes, bool allocate);

// Copies n bytes, split across the default thread pool when large.
void ParallelMemcpy(void* dst, const void* src, std::size_t n);
// Zeroes n bytes, split across the default thread pool when large.
void ParallelZero(void* dst, std::size_t n);

// Copies into / out of a file with pwrite / pread, in parallel chunks on the default
// thread pool when large. On tmpfs this needs no page-table set-up in the calling
// process, which makes it the fastest one-shot copy into or out of shared memory.
// A full file system is ResourceExhausted; a short file is DataLoss.
Status PwriteAll(const std::string& file, uint64_t offset, const void* data, uint64_t size);
Status PreadAll(const std::string& file, uint64_t offset, void* dst, uint64_t size);
Status PwriteFd(int fd, const std::string& name, uint64_t offset, const void* data, uint64_t size);

// Receives a new tensor's bytes in order (Store::PutFrom): Write appends at the
// running offset; more bytes than the tensor holds is InvalidArgument.
class TensorSink {
 public:
  TensorSink(int fd, std::string name, uint64_t size)
      : fd_(fd), name_(std::move(name)), size_(size) {}
  Status Write(const void* data, uint64_t n);
  uint64_t written() const { return written_; }
  uint64_t size() const { return size_; }

 private:
  int fd_;
  std::string name_;
  uint64_t size_;
  uint64_t written_ = 0;
};

}  // namespace tenplex::store
