// Same-host reads: the committed tensor files of a peer daemon on this machine, read
// directly from its shared-memory directory instead of over the data plane
// (docs/transport.md, "Same-host peers").
//
// Two daemons of one host may share nothing but the machine: each has its own store
// directory under /dev/shm. When the reader sees the peer's directory (same kernel:
// the same boot id; same mount namespace: the STORE_ID file in the directory the peer
// names holds the id the peer announced over HTTP), a box of a peer's tensor is a pread
// of the peer's file into the local destination: one kernel copy, no TCP, no staging.
// Which files may be read is the peer's decision: it names them (path, size, device
// and inode) through its authenticated control API after the same capability check a
// data-plane fetch gets (cluster/agent.h); PeerFile::Open then insists on exactly
// that file: inside the peer's directory, not a symbolic link (O_NOFOLLOW), a regular
// file, of the announced size, with the announced device and inode, so that a file
// swapped in under the same name between the answer and the open is refused.
// Committed tensor files are immutable, so bytes read through an open descriptor are
// the committed bytes even if the peer releases the version meanwhile: the peer's agent
// keeps a reference to every file it names, so its page pool (store.h) never recycles
// one of them for a new tensor under the reader's descriptor.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "tenplex/transport/transport.h"
#include "tenplex/util/status.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::transport {

// This machine's running kernel (/proc/sys/kernel/random/boot_id), "" where unknown.
const std::string& HostBootId();

// True when `dir` is the store directory of the store with id `store_id` as this
// process sees it: <dir>/STORE_ID holds "<store_id>\n".
bool SeesStoreDirectory(const std::string& dir, const std::string& store_id);

// A peer's file, opened read-only. Move-only; closes on destruction.
class PeerFile {
 public:
  // `file` must be below `dir` (an absolute path; no "." or ".." components), a
  // regular file reached without a symbolic link as its last component, exactly
  // `bytes` long, on device `dev` with inode `ino`. FailedPrecondition naming the file
  // and what differs otherwise; errno errors of open keep their code (NotFound,
  // PermissionDenied).
  static Result<PeerFile> Open(const std::string& dir, const std::string& file, uint64_t bytes,
                               uint64_t dev, uint64_t ino);
  PeerFile() = default;
  PeerFile(PeerFile&& o) noexcept;
  PeerFile& operator=(PeerFile&& o) noexcept;
  PeerFile(const PeerFile&) = delete;
  PeerFile& operator=(const PeerFile&) = delete;
  ~PeerFile();

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string name_;
};

// The identity (device, inode) of a file, as PeerFile::Open compares it.
struct FileIdentity {
  uint64_t dev = 0, ino = 0, bytes = 0;
};
Result<FileIdentity> IdentifyFile(const std::string& file);

// One file's runs (offsets into the file, as in a ReadRequest).
struct PeerFileRuns {
  const PeerFile* file = nullptr;
  const std::vector<ReadRun>* runs = nullptr;
};

// Copies every run with pread, in tasks of about 4 MiB on the pool (null: this
// thread). A run past the end of its file is OutOfRange (nothing is read then); a
// null destination InvalidArgument. `cancel` (may be null) is checked between reads:
// once it is set the copy stops and returns Aborted. Returns the bytes copied.
Result<uint64_t> ReadPeerFiles(const std::vector<PeerFileRuns>& files, ThreadPool* pool,
                               const std::atomic<bool>* cancel);

}  // namespace tenplex::transport
