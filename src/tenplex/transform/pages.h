// Populating mapped pages ahead of use.
//
// Filling a fresh mapping of a tmpfs or page-cache file takes one page fault per 4 KiB
// page; on these machines that costs more than the copy itself (about 0.2 GB/s for
// memcpy into a fresh /dev/shm mapping against 1 GB/s with the pages populated first).
// Populate asks the kernel for all pages of a range with one madvise per 64 MiB chunk
// (MADV_POPULATE_READ / MADV_POPULATE_WRITE, Linux 5.14), chunks spread over a pool.
#pragma once

#include <cstddef>

#include "tenplex/util/thread_pool.h"

namespace tenplex::transform {

// Best effort: on kernels without MADV_POPULATE_* it does nothing and pages fault later.
void Populate(const void* p, std::size_t n, bool write, ThreadPool* pool = nullptr);

}  // namespace tenplex::transform
