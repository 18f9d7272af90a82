// Opening files of the store's tree without following symbolic links out of it (issue 35:
// a job directory, a version or rank directory, or a tensor file replaced by a link
// while the daemon runs must not make it read or write outside its directory).
//
// OpenBeneath resolves `path` relative to `root` with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS) where the kernel has it (Linux 5.6+), else component by
// component with O_NOFOLLOW: a link anywhere below root (the root itself may be reached
// through links) is refused with FailedPrecondition naming the path; nothing on the way
// is followed. No time-of-check gap: the kernel resolves and opens in one step.
#pragma once

#include <string>

#include "tenplex/store/mapping.h"
#include "tenplex/util/fd.h"
#include "tenplex/util/status.h"

namespace tenplex::store {

using ::tenplex::Fd;  // util/fd.h

// Opens `path`, which must lie inside `root` (a prefix "root/"), with open(2) `flags`
// (O_CLOEXEC added). A symbolic link below root: FailedPrecondition; a path outside
// root: InvalidArgument; other errors as ErrnoError.
Result<Fd> OpenBeneath(const std::string& root, const std::string& path, int flags,
                       int mode = 0600);

// The directory that holds `path` (inside root), opened O_PATH | O_DIRECTORY beneath
// root, and path's last component: for renameat/linkat into the tree.
struct ParentDir {
  Fd dir;
  std::string name;
};
Result<ParentDir> OpenParentBeneath(const std::string& root, const std::string& path);

// ShmMapping::Map of `file` (inside root, read-only) opened by OpenBeneath: the store's
// own reads of its tensor files. A FIFO there fails at once (not a regular file).
Result<ShmMapping> MapBeneath(const std::string& root, const std::string& file, uint64_t bytes,
                              bool populate = false);

// xxh64 of the first `bytes` bytes of `file` (inside root, opened as MapBeneath opens it),
// read without a mapping (Xxh64HexOfFile, util/hash.h). A shorter file is DataLoss.
Result<std::string> Xxh64Beneath(const std::string& root, const std::string& file, uint64_t bytes);

}  // namespace tenplex::store
