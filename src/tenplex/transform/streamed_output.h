// Writing a checkpoint's new rank files with pwrite from warm buffers (the output path
// of `tenplex reshard`).
//
// Why not mmap: filling a freshly mapped tmpfs or page-cache file costs one page fault
// per 4 KiB page, and on virtual machines that costs more than the copy (0.06-0.2 GB/s
// into a fresh /dev/shm mapping against 1-4 GB/s for write(2) of the same bytes, where
// the kernel allocates the pages itself). So each output file is produced in chunks:
//
//   1. The file (under a temporary name in the checkpoint's staging directory) gets its
//      whole size reserved with posix_fallocate before any byte is written, so a full
//      disk fails here, with a clear error, not in the middle; its header is written.
//   2. The data section is cut into chunks of `chunk_bytes` (4 MiB: they stay in the
//      cache). A few threads take chunks in order; each assembles its chunk in its own
//      buffer, allocated once and reused (warm): for every plan op writing a tensor the
//      chunk overlaps, the op's runs (geometry/copy.h CopyRuns: contiguous byte runs at
//      increasing destination offsets) that fall inside the chunk are found by binary
//      search and copied, clipped to the chunk, read from the input file with pread
//      (below) rather than through its mapping; a tensor whose ops do not cover it
//      (padding) is zeroed first. The chunk is then written with pwrite and, on a disk,
//      its writeback started (sync_file_range), so the final fsync has little left.
//   3. The xxh64 of each file (header, then data) is computed from the chunk buffers
//      while they are hot, in file order: a thread whose chunk is next hashes it; the
//      others wait for their turn, holding only their own buffer. The thread with the
//      lowest outstanding chunk never waits, so there is no deadlock.
//   4. Every file is fsynced (in parallel) and renamed to its final name; the caller
//      commits tenplex.json and the directory (io::CheckpointWriter).
//
// Reading, copying, hashing and writing thus overlap across threads, and no byte of the
// output is touched through a mapping. The bytes written are exactly those of
// ExecutePlan into zero-filled mapped files (the reshard tests compare both paths).
// Plans with ops that read from the new layout (src_new) are not streamed
// (CanStreamPlan): their source may be another output file's chunk not yet produced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tenplex/plan/planner.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/util/status.h"

namespace tenplex::transform {

// Where a source tensor's bytes are: its mapping and, when fd >= 0, the file and offset
// they can also be read from with pread (the kernel copies from the page cache, no
// page of a fresh mapping is touched: the cheaper read on these machines).
struct StreamSource {
  const void* data = nullptr;
  int fd = -1;
  uint64_t offset = 0;
};

struct StreamOptions {
  std::size_t chunk_bytes = 4 << 20;
  int threads = 0;                          // 0: the machine's cores (at least 2, at most 8)
  std::size_t direct_run_bytes = 64 << 10;  // runs this long are read straight into the chunk
};

// Whether WriteRankFilesStreamed can write this plan (no op reads the new layout).
bool CanStreamPlan(const plan::Plan& plan);

// Writes new rank r's safetensors file (tensors of `to`, in layout order, no metadata)
// to paths[r], filled by `plan` from the old ranks' tensors src[r][i] (layout `from`).
// An op's runs inside a chunk are read with one pread into the chunk buffer (runs of
// direct_run_bytes and more, each), or one pread of the source span they lie in into a staging
// buffer when that span is dense enough (at most 4x the bytes needed), else copied from
// the mapping.
// Returns the xxh64 of every file as 16 hex digits. On an error no file of `paths` (nor
// any temporary) is left.
Result<std::vector<std::string>> WriteRankFilesStreamed(
    const plan::Plan& plan, const Layout& from, const Layout& to,
    const std::vector<std::vector<StreamSource>>& src, const std::vector<std::string>& paths,
    const StreamOptions& options = {});

}  // namespace tenplex::transform
