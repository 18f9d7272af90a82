// Shared-memory tensor files and their memory maps. A tensor's bytes are one file in
// the store's shared-memory directory (tmpfs), offset 0, exactly `bytes` long. The
// store and any local process (a training process, `tenplex store load`) map the same
// file with MAP_SHARED, so a hand-off is zero-copy and the bytes outlive the process
// that wrote them.
#pragma once

#include <cstdint>
#include <string>

#include "tenplex/util/status.h"

namespace tenplex::store {

// A MAP_SHARED map of [offset, offset + bytes) of a file. Move-only; unmaps on
// destruction. A zero-byte map has data() == nullptr.
class ShmMapping {
 public:
  // Maps an existing file; the file must hold at least offset + bytes bytes (checked,
  // so a truncated file is an error here and never a SIGBUS later). `populate`
  // pre-faults the pages (MAP_POPULATE), which is faster for a full write or read.
  static Result<ShmMapping> Map(const std::string& file, uint64_t offset, uint64_t bytes, bool writable,
                                bool populate = false);
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
  // following bulk copy runs at memcpy speed; a no-op where the kernel lacks it.
  void Prefault() const;

 private:
  void Reset();
  uint8_t* base_ = nullptr;  // page-aligned start of the map
  uint64_t map_size_ = 0;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool writable_ = false;
};

// Copies n bytes, split across the default thread pool when large.
void ParallelMemcpy(void* dst, const void* src, std::size_t n);

}  // namespace tenplex::store
