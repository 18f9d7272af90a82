#include "tenplex/transport/peer_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "tenplex/util/file.h"

namespace tenplex::transport {
namespace {

constexpr uint64_t kTaskBytes = 4ull << 20;

// True when `file` names something below `dir` without "." or ".." components.
bool Below(const std::string& dir, const std::string& file) {
  if (dir.empty() || dir[0] != '/' || file.size() <= dir.size() + 1) return false;
  if (file.compare(0, dir.size(), dir) != 0 || file[dir.size()] != '/') return false;
  std::size_t at = dir.size() + 1;
  while (at <= file.size()) {
    std::size_t end = file.find('/', at);
    if (end == std::string::npos) end = file.size();
    const std::string_view part(file.data() + at, end - at);
    if (part.empty() || part == "." || part == "..") return false;
    at = end + 1;
  }
  return true;
}

// A piece of a run (runs are cut at kTaskBytes): `length` bytes at `offset` of file
// `fd` into `dest`.
struct Piece {
  int fd;
  uint64_t offset, length;
  uint8_t* dest;
};

// Where a piece starts: byte `at` of run `run` of files[file].
struct PieceAt {
  std::size_t file = 0, run = 0;
  uint64_t at = 0;
};

// Moves `c` onto a piece (past empty runs and the ends of runs and files); false past
// the last piece.
bool Settle(const std::vector<PeerFileRuns>& files, PieceAt& c) {
  while (c.file < files.size()) {
    const std::vector<ReadRun>& runs = *files[c.file].runs;
    if (c.run >= runs.size()) {
      ++c.file;
      c.run = 0;
    } else if (c.at >= runs[c.run].length) {
      ++c.run;
      c.at = 0;
    } else {
      return true;
    }
  }
  return false;
}

// Moves `c` to the next piece; false past the last.
bool NextPiece(const std::vector<PeerFileRuns>& files, PieceAt& c) {
  c.at += kTaskBytes;
  return Settle(files, c);
}

Piece PieceOf(const std::vector<PeerFileRuns>& files, const PieceAt& c) {
  const ReadRun& r = (*files[c.file].runs)[c.run];
  return {files[c.file].file->fd(), r.offset + c.at, std::min(kTaskBytes, r.length - c.at),
          static_cast<uint8_t*>(r.dest) + c.at};
}

// Consecutive pieces read with one preadv: `pieces` of them from `first`, `bytes` of
// the file from the first's offset, the gaps between them included (their bytes go to a
// scratch buffer that is dropped). Not stored as pieces: a reshard along the last
// dimension has hundreds of thousands of short runs per host, and a vector of them is
// fresh memory, whose first touch costs more on some VMs than the copy it describes.
struct Span {
  PieceAt first;
  std::size_t pieces = 0;
  uint64_t bytes = 0;
};

// Spans. A reshard along a tensor's last dimension reads one short run per row (a
// tp=4 -> tp=8 change of a 1024-wide weight: 2 KiB runs, 2 KiB apart), and one pread per
// run spends more in the system call than in the copy (profiled at 4 daemons, gpt3-350m
// tp=4 -> tp=8: over half of the same-host fetch's CPU outside the copy). Consecutive
// short runs of a file that are close together are read with one preadv, the gaps
// between them included: a gap costs a copy of its bytes, a run saved costs a system
// call (~1-2 us, a 4-16 KiB copy). A span holds runs shorter than kSpanRunBytes, gaps of
// at most kSpanGapBytes and no larger than 3 runs' worth, at most kSpanIov pieces (and
// as many gaps) and kSpanBytes of file.
constexpr uint64_t kSpanRunBytes = 64 << 10;
constexpr uint64_t kSpanGapBytes = 16 << 10;
constexpr std::size_t kSpanIov = 256;  // 2 iovecs each: <= IOV_MAX (1024)
constexpr uint64_t kSpanBytes = 1 << 20;

bool Joinable(const Piece& a, const Piece& b, std::size_t in_span, uint64_t span_bytes) {
  if (a.fd != b.fd || a.length >= kSpanRunBytes || b.length >= kSpanRunBytes) return false;
  if (b.offset < a.offset + a.length) return false;  // backwards or overlapping
  const uint64_t gap = b.offset - (a.offset + a.length);
  return gap <= kSpanGapBytes && gap <= 3 * std::max(a.length, b.length) && in_span < kSpanIov &&
         span_bytes + gap + b.length <= kSpanBytes;
}

// Reads `total` bytes at `offset` of fd into iov[0..n) (modified as it goes). Returns 0,
// an errno, or -1 when the file ended first.
int PreadvFully(int fd, struct iovec* iov, int n, uint64_t offset, uint64_t total) {
  uint64_t done = 0;
  while (done < total) {
    const ssize_t r = ::preadv(fd, iov, n, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r < 0 ? errno : -1;
    done += static_cast<uint64_t>(r);
    // Skip the iovecs that are full, shorten the first one that is not.
    uint64_t left = static_cast<uint64_t>(r);
    while (n > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --n;
    }
    if (n > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return 0;
}

// Every run names a destination and lies inside its file.
Status CheckRuns(const std::vector<PeerFileRuns>& files) {
  for (const PeerFileRuns& f : files) {
    for (const ReadRun& r : *f.runs) {
      if (r.length == 0) continue;
      if (r.dest == nullptr) return InvalidArgument("null destination reading " + f.file->name());
      if (r.offset > f.file->size() || r.length > f.file->size() - r.offset) {
        return OutOfRange("run [" + std::to_string(r.offset) + ", +" + std::to_string(r.length) +
                          ") is past the end of " + f.file->name() + " (" +
                          std::to_string(f.file->size()) + " bytes)");
      }
    }
  }
  return Status::Ok();
}

// The runs cut into pieces, close short pieces joined into spans, and the spans grouped
// into tasks of about kTaskBytes (a span never crosses a task): task t is spans
// [task_begin[t], task_begin[t + 1]). `total`: the runs' bytes, gaps not counted.
struct SpanTasks {
  std::vector<Span> spans;
  std::vector<std::size_t> task_begin{0};
  uint64_t total = 0;
};

SpanTasks CutIntoSpans(const std::vector<PeerFileRuns>& files) {
  SpanTasks st;
  uint64_t in_task = 0;
  Piece prev{};
  PieceAt cursor;
  for (bool more = Settle(files, cursor); more; more = NextPiece(files, cursor)) {
    const Piece p = PieceOf(files, cursor);
    if (st.task_begin.back() != st.spans.size() &&
        Joinable(prev, p, st.spans.back().pieces, st.spans.back().bytes)) {
      const uint64_t gap = p.offset - (prev.offset + prev.length);
      st.spans.back().pieces += 1;
      st.spans.back().bytes += gap + p.length;
      in_task += gap;
    } else {
      st.spans.push_back({cursor, 1, p.length});
    }
    prev = p;
    in_task += p.length;
    st.total += p.length;
    if (in_task >= kTaskBytes) {
      st.task_begin.push_back(st.spans.size());
      in_task = 0;
    }
  }
  if (st.task_begin.back() != st.spans.size()) st.task_begin.push_back(st.spans.size());
  return st;
}

// One preadv: the span's pieces with the gaps between them (into `scratch`). `iov` and
// `scratch` are the caller's, reused from span to span. Returns PreadvFully's result.
int ReadSpan(const std::vector<PeerFileRuns>& files, const Span& sp, std::vector<struct iovec>& iov,
             std::vector<uint8_t>& scratch) {
  iov.clear();
  PieceAt c = sp.first;
  const Piece first = PieceOf(files, c);
  uint64_t end = first.offset;
  for (std::size_t k = 0; k < sp.pieces; ++k) {
    const Piece q = PieceOf(files, c);
    if (q.offset > end) {
      if (scratch.empty()) scratch.resize(kSpanGapBytes);
      iov.push_back({scratch.data(), q.offset - end});
    }
    iov.push_back({q.dest, q.length});
    end = q.offset + q.length;
    NextPiece(files, c);
  }
  return PreadvFully(first.fd, iov.data(), static_cast<int>(iov.size()), first.offset, sp.bytes);
}

}  // namespace

const std::string& HostBootId() {
  static const std::string id = [] {
    Result<std::string> s = ReadFile("/proc/sys/kernel/random/boot_id");
    if (!s.ok()) return std::string();
    std::string v = *s;
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
    return v;
  }();
  return id;
}

bool SeesStoreDirectory(const std::string& dir, const std::string& store_id) {
  if (dir.empty() || dir[0] != '/' || store_id.empty()) return false;
  Result<std::string> id = ReadRegularFile(dir + "/STORE_ID");
  return id.ok() && *id == store_id + "\n";
}

PeerFile::PeerFile(PeerFile&& o) noexcept : fd_(o.fd_), size_(o.size_), name_(std::move(o.name_)) {
  o.fd_ = -1;
}

PeerFile& PeerFile::operator=(PeerFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    size_ = o.size_;
    name_ = std::move(o.name_);
    o.fd_ = -1;
  }
  return *this;
}

PeerFile::~PeerFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<PeerFile> PeerFile::Open(const std::string& dir, const std::string& file, uint64_t bytes,
                                uint64_t dev, uint64_t ino) {
  if (!Below(dir, file)) {
    return FailedPrecondition("peer file " + file + " is not inside the peer's directory " + dir);
  }
  // O_NOFOLLOW, O_NONBLOCK, then fstat: a link, FIFO, directory or device is refused.
  TP_ASSIGN_OR_RETURN(int fd, OpenRegularFile(file));
  PeerFile f;
  f.fd_ = fd;
  f.name_ = file;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoError("fstat " + file, errno);
  if (static_cast<uint64_t>(st.st_dev) != dev || static_cast<uint64_t>(st.st_ino) != ino) {
    return FailedPrecondition("peer file " + file +
                              " is not the file the peer named (another device or inode)");
  }
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    return FailedPrecondition("peer file " + file + " has " + std::to_string(st.st_size) +
                              " bytes, the peer said " + std::to_string(bytes));
  }
  f.size_ = bytes;
  return f;
}

Result<FileIdentity> IdentifyFile(const std::string& file) {
  struct stat st {};
  if (::lstat(file.c_str(), &st) != 0) return ErrnoError("stat " + file, errno);
  if (!S_ISREG(st.st_mode)) return FailedPrecondition(file + " is not a regular file");
  return FileIdentity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                      static_cast<uint64_t>(st.st_size)};
}

Result<uint64_t> ReadPeerFiles(const std::vector<PeerFileRuns>& files, ThreadPool* pool,
                               const std::atomic<bool>* cancel) {
  TP_RETURN_IF_ERROR(CheckRuns(files));
  const SpanTasks st = CutIntoSpans(files);
  const std::size_t tasks = st.task_begin.size() - 1;
  std::atomic<int> err{0};  // errno, or -1: a short read (the file shrank)
  std::atomic<bool> stopped{false};
  auto run = [&](std::size_t t) {
    std::vector<struct iovec> iov;
    std::vector<uint8_t> scratch;  // the gaps' bytes, dropped
    for (std::size_t i = st.task_begin[t]; i < st.task_begin[t + 1]; ++i) {
      if (err != 0) return;
      if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
        stopped = true;
        return;
      }
      const int e = ReadSpan(files, st.spans[i], iov, scratch);
      if (e != 0) {
        err = e;
        return;
      }
    }
  };
  if (pool == nullptr || tasks <= 1) {
    for (std::size_t t = 0; t < tasks; ++t) run(t);
  } else {
    pool->ParallelFor(tasks, run);
  }
  if (err == -1) return DataLoss("a peer file ended before its announced size");
  if (err != 0) return ErrnoError("reading a peer file", err);
  if (stopped) return Aborted("the read from the peer's files was cancelled");
  return st.total;
}

}  // namespace tenplex::transport
