#include "tenplex/transform/pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

namespace tenplex::transform {

void Populate(const void* p, std::size_t n, bool write, ThreadPool* pool) {
#if defined(MADV_POPULATE_READ) && defined(MADV_POPULATE_WRITE)
  if (n == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  const uintptr_t chunk = uintptr_t{64} << 20;
  const std::size_t chunks = (end - begin + chunk - 1) / chunk;
  auto one = [&](std::size_t c) {
    const uintptr_t b = begin + c * chunk, e = std::min(end, b + chunk);
    (void)::madvise(reinterpret_cast<void*>(b), e - b,
                    write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
  };
  if (pool && chunks > 1) {
    pool->ParallelFor(chunks, one);
  } else {
    for (std::size_t c = 0; c < chunks; ++c) one(c);
  }
#else
  (void)p, (void)n, (void)write, (void)pool;
#endif
}

}  // namespace tenplex::transform
