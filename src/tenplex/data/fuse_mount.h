// Serving a FileTree (view.h; a DatasetView) as a read-only FUSE file system (libfuse3).
//
// The file system is a thin shell: getattr/readdir answer from the view's directory
// table, read calls ViewFile::Read for exactly the requested range (nothing is cached
// or copied beyond it), everything else is EROFS/EACCES/ENOENT. Requests are served by
// several threads; the tree is immutable so no locks are needed. The
// kernel page cache is dropped on every open (no keep_cache), so each open reads
// through this process.
#pragma once

#include <memory>
#include <string>

#include "tenplex/data/view.h"
#include "tenplex/util/status.h"

namespace tenplex::data {

struct MountOptions {
  int threads = 4;           // request-serving threads
  bool allow_other = false;  // let other users read (root, or user_allow_other)
  bool debug = false;        // libfuse's request log on stderr
  // Make SIGTERM, SIGINT and SIGHUP stop serving (and unmount). The calling thread and
  // the serving threads block them; a watcher thread sigwaits for them. For the CLI.
  bool handle_signals = false;
  // Kernel readahead window for the mount (KiB; 0 = kernel default, 128). Larger
  // windows mean fewer, larger read requests for sequential readers. Needs root.
  int read_ahead_kb = 4096;
};

// A mounted view, served by a few threads of our own (fuse_session_receive_buf /
// process_buf, so that stopping is in our hands: Stop() flags the threads and kicks
// them out of their blocking read with SIGUSR2, whose handler does nothing). Installs
// that no-op SIGUSR2 handler for the process.
class FuseMount {
 public:
  // Mounts (read-only) and starts serving; returns once the mount is live.
  static Result<std::unique_ptr<FuseMount>> Start(std::shared_ptr<const FileTree> view,
                                                  const std::string& mountpoint,
                                                  const MountOptions& options = {});
  ~FuseMount();  // Stop()
  FuseMount(const FuseMount&) = delete;
  FuseMount& operator=(const FuseMount&) = delete;

  // Blocks until serving ends: an external unmount (`fusermount3 -u M`, `umount M`),
  // a handled signal, or Stop() from another thread. Then unmounts (if still mounted)
  // and returns Ok, or the error that ended serving.
  Status Wait();
  // Stops serving, unmounts, and returns when done. Idempotent; thread-safe.
  void Stop();

  struct Impl;

 private:
  explicit FuseMount(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tenplex::data
