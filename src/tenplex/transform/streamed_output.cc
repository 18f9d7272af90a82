#include "tenplex/transform/streamed_output.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "tenplex/geometry/copy.h"
#include "tenplex/io/safetensors.h"
#include "tenplex/transform/executor.h"
#include "tenplex/util/file.h"
#include "tenplex/util/hash.h"
#include "tenplex/util/log.h"

namespace tenplex::transform {
namespace {

using plan::CopyOp;

// One op's runs into a destination tensor, with the source tensor's first byte.
struct OpRuns {
  CopyRuns runs;
  StreamSource src;
};

// The name errors give an input file (a short read: it is shorter than its header says).
constexpr char kInputFile[] = "an input checkpoint file";

struct TensorPlan {
  uint64_t begin = 0, end = 0;  // in the file's data section
  bool zero_first = false;      // ops do not cover every byte (padding)
  uint64_t covered = 0;         // bytes the ops write
  std::vector<OpRuns> ops;      // in plan order
};

struct OutFile {
  std::string path, tmp;
  int fd = -1;
  uint64_t data_offset = 0, data_bytes = 0;
  std::vector<TensorPlan> tensors;
  XXH64_state_t* hash = nullptr;
  std::string sum;
};

struct Chunk {
  std::size_t file = 0;
  uint64_t begin = 0, end = 0;  // in the data section
};

// Temporary files and hash states, removed unless released.
struct Files {
  std::vector<OutFile> files;
  bool keep = false;
  ~Files() {
    for (OutFile& f : files) {
      if (f.hash) XXH64_freeState(f.hash);
      if (f.fd >= 0) ::close(f.fd);
      if (!keep && !f.tmp.empty()) ::unlink(f.tmp.c_str());
    }
  }
};

// The first run of r whose bytes end after `at` (runs are at increasing offsets).
int64_t FirstRunEndingAfter(const CopyRuns& r, int64_t at) {
  int64_t lo = 0, hi = r.count;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (r.DstOffset(mid) + r.run_bytes > at) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// The first run of r starting at or after `at`.
int64_t FirstRunFrom(const CopyRuns& r, int64_t at) {
  int64_t lo = 0, hi = r.count;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (r.DstOffset(mid) >= at) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// The runs [first, last) of o clipped to the tensor bytes [ta, tb), into out (which
// holds the tensor's byte ta); `stage` is a scratch buffer of stage_bytes.
Status CopyRunsClipped(const OpRuns& o, int64_t first, int64_t last, int64_t ta, int64_t tb,
                       uint8_t* out, uint8_t* stage, std::size_t stage_bytes, int64_t direct_run) {
  const int64_t run = o.runs.run_bytes;
  // Source byte so lies at base + (so - base_off): in the mapping, or in the stage.
  const uint8_t* base = static_cast<const uint8_t*>(o.src.data);
  int64_t base_off = 0;
  if (o.src.fd >= 0 && run >= direct_run) {
    Status s;
    o.runs.ForEach(first, last, [&](int64_t so, int64_t dof) {
      const int64_t lo = std::max(dof, ta), hi = std::min(dof + run, tb);
      if (s.ok()) {
        s = PreadExact(o.src.fd, out + (lo - ta), static_cast<uint64_t>(hi - lo),
                       o.src.offset + static_cast<uint64_t>(so + (lo - dof)), kInputFile);
      }
    });
    return s;
  }
  if (o.src.fd >= 0) {
    const int64_t s0 = o.runs.SrcOffset(first), s1 = o.runs.SrcOffset(last - 1) + run;
    const int64_t need = (last - first) * run;
    if (s1 - s0 <= static_cast<int64_t>(stage_bytes) && s1 - s0 <= 4 * need) {
      TP_RETURN_IF_ERROR(PreadExact(o.src.fd, stage, static_cast<uint64_t>(s1 - s0),
                                    o.src.offset + static_cast<uint64_t>(s0), kInputFile));
      base = stage;
      base_off = s0;
    }
  }
  o.runs.ForEach(first, last, [&](int64_t so, int64_t dof) {
    const int64_t lo = std::max(dof, ta), hi = std::min(dof + run, tb);
    std::memcpy(out + (lo - ta), base + (so - base_off) + (lo - dof),
                static_cast<std::size_t>(hi - lo));
  });
  return Status::Ok();
}

// Bytes [a, b) of the file's data section into buf.
Status Assemble(const OutFile& f, uint64_t a, uint64_t b, uint8_t* buf, uint8_t* stage,
                std::size_t stage_bytes, int64_t direct_run) {
  auto t = std::upper_bound(f.tensors.begin(), f.tensors.end(), a,
                            [](uint64_t x, const TensorPlan& tp) { return x < tp.end; });
  for (; t != f.tensors.end() && t->begin < b; ++t) {
    // Tensor-relative range of the chunk and where it lands in buf.
    const int64_t ta = static_cast<int64_t>(std::max(a, t->begin) - t->begin);
    const int64_t tb = static_cast<int64_t>(std::min(b, t->end) - t->begin);
    uint8_t* out = buf + (t->begin + ta - a);
    if (t->zero_first) std::memset(out, 0, static_cast<std::size_t>(tb - ta));
    for (const OpRuns& o : t->ops) {
      const int64_t first = FirstRunEndingAfter(o.runs, ta);
      const int64_t last = FirstRunFrom(o.runs, tb);
      if (first >= last) continue;
      TP_RETURN_IF_ERROR(
          CopyRunsClipped(o, first, last, ta, tb, out, stage, stage_bytes, direct_run));
    }
  }
  return Status::Ok();
}

// Files, headers written and hashed, space reserved, tensors' ops resolved.
Status Prepare(const plan::Plan& plan, const Layout& from, const Layout& to,
               const std::vector<std::vector<StreamSource>>& src,
               const std::vector<std::string>& paths, Files& out) {
  if (paths.size() != to.ranks.size() || src.size() != from.ranks.size())
    return InvalidArgument("streamed output: paths or sources do not match the layouts");
  out.files.resize(to.ranks.size());
  for (std::size_t r = 0; r < to.ranks.size(); ++r) {
    const RankLayout& rl = to.ranks[r];
    OutFile& f = out.files[r];
    f.path = paths[r];
    std::vector<io::SafetensorsEntry> entries;
    entries.reserve(rl.tensors->size());
    for (const LocalTensor& t : *rl.tensors) {
      TP_RETURN_IF_ERROR(CheckedVolume(t.shape, static_cast<int64_t>(DTypeSize(t.dtype))).status());
      entries.push_back({t.name, t.dtype, t.shape, 0, 0});
    }
    const std::string header = io::EncodeSafetensorsHeader(entries, {});
    f.data_offset = header.size();
    for (std::size_t i = 0; i < entries.size(); ++i) {
      TensorPlan tp;
      tp.begin = entries[i].begin;
      tp.end = entries[i].end;
      tp.zero_first = !PaddingBoxes((*rl.tensors)[i]).empty();
      f.tensors.push_back(std::move(tp));
      f.data_bytes = std::max(f.data_bytes, entries[i].end);
    }
    f.tmp = TempNameFor(f.path);
    f.fd = ::open(f.tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f.fd < 0) {
      f.tmp.clear();
      return ErrnoError("create " + TempNameFor(f.path), errno);
    }
    const uint64_t size = f.data_offset + f.data_bytes;
    TP_RETURN_IF_ERROR(ReserveFileSpace(f.fd, size, f.path));
    TP_RETURN_IF_ERROR(PwriteExact(f.fd, header.data(), header.size(), 0, f.tmp));
    f.hash = XXH64_createState();
    XXH64_reset(f.hash, 0);
    XXH64_update(f.hash, header.data(), header.size());
  }
  // Ops in plan order (kept regions first, as ExecutePlan copies them).
  auto add = [&](const CopyOp& op) -> Status {
    if (op.src_new) return InvalidArgument("streamed output: an op reads the new layout");
    const LocalTensor& st = (*from.ranks.at(op.src_rank).tensors).at(op.src_tensor);
    const LocalTensor& dt = (*to.ranks.at(op.dst_rank).tensors).at(op.dst_tensor);
    if (st.dtype != dt.dtype) {
      return InvalidArgument("op copies " + st.name + " (" + std::string(DTypeName(st.dtype)) +
                             ") into " + dt.name + " (" + std::string(DTypeName(dt.dtype)) + ")");
    }
    if (static_cast<std::size_t>(op.src_tensor) >= src[op.src_rank].size() ||
        src[op.src_rank][op.src_tensor].data == nullptr)
      return InvalidArgument("no source buffer for rank " + std::to_string(op.src_rank) +
                             " tensor " + st.name);
    TP_ASSIGN_OR_RETURN(CopyRuns runs,
                        PlanCopyRuns(st.shape, op.src, dt.shape, op.dst, DTypeSize(dt.dtype)));
    if (runs.count == 0) return Status::Ok();
    TensorPlan& t = out.files[op.dst_rank].tensors[op.dst_tensor];
    t.covered += static_cast<uint64_t>(runs.count * runs.run_bytes);
    t.ops.push_back({std::move(runs), src[op.src_rank][op.src_tensor]});
    return Status::Ok();
  };
  for (const CopyOp& op : plan.kept) TP_RETURN_IF_ERROR(add(op));
  for (const CopyOp& op : plan.ops) TP_RETURN_IF_ERROR(add(op));
  // Bytes no op writes are zero, as in a fresh file (padding; a plan that leaves a gap).
  for (OutFile& f : out.files) {
    for (TensorPlan& t : f.tensors) t.zero_first = t.zero_first || t.covered < t.end - t.begin;
  }
  return Status::Ok();
}

int Threads(const StreamOptions& o) {
  if (o.threads > 0) return o.threads;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(hw, 2, 8);
}

// Every file's data section in chunks of `chunk` bytes, file by file.
std::vector<Chunk> ChunksOf(const Files& files, uint64_t chunk) {
  std::vector<Chunk> chunks;
  for (std::size_t i = 0; i < files.files.size(); ++i) {
    for (uint64_t a = 0; a < files.files[i].data_bytes; a += chunk)
      chunks.push_back({i, a, std::min(files.files[i].data_bytes, a + chunk)});
  }
  return chunks;
}

// Writeback of each chunk is started at once where it means anything (not tmpfs).
bool StartsWriteback(const Files& files) {
  if (files.files.empty()) return false;
  struct statfs fs;
  return ::fstatfs(files.files.front().fd, &fs) == 0 &&
         static_cast<unsigned long>(fs.f_type) != TMPFS_MAGIC;
}

// Writes the chunks on a few threads: each assembles a chunk in its own buffer and
// writes it; the files' hashes are updated in chunk order (a thread waits for its turn),
// so each is the hash of its file's bytes in order. The first error stops every thread.
class ChunkWriter {
 public:
  ChunkWriter(Files& files, const std::vector<Chunk>& chunks, uint64_t chunk, bool start_writeback,
              int64_t direct_run)
      : files_(files),
        chunks_(chunks),
        chunk_(chunk),
        start_writeback_(start_writeback),
        direct_run_(direct_run) {}

  Status Run(int threads) {
    std::vector<std::thread> others;
    for (int i = 1; i < threads; ++i) others.emplace_back([this] { Work(); });
    Work();
    for (std::thread& t : others) t.join();
    if (failed_) return error_;
    return Status::Ok();
  }

 private:
  void Fail(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_) error_ = std::move(s);
    failed_ = true;
    turn_cv_.notify_all();
  }

  void Work() {
    std::unique_ptr<uint8_t[]> buf(new uint8_t[chunk_]);
    const std::size_t stage_bytes = 2 * chunk_;
    std::unique_ptr<uint8_t[]> stage(new uint8_t[stage_bytes]);
    for (;;) {
      const std::size_t k = next_.fetch_add(1);
      if (k >= chunks_.size()) return;
      const Chunk& c = chunks_[k];
      OutFile& f = files_.files[c.file];
      const std::size_t n = static_cast<std::size_t>(c.end - c.begin);
      Status s = Assemble(f, c.begin, c.end, buf.get(), stage.get(), stage_bytes, direct_run_);
      if (!s.ok()) return Fail(std::move(s));
      s = PwriteExact(f.fd, buf.get(), n, f.data_offset + c.begin, f.tmp);
      if (!s.ok()) return Fail(std::move(s));
      if (start_writeback_) {
        (void)::sync_file_range(f.fd, static_cast<off_t>(f.data_offset + c.begin),
                                static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE);
      }
      std::unique_lock<std::mutex> lock(mu_);
      turn_cv_.wait(lock, [&] { return failed_ || turn_ == k; });
      if (failed_) return;
      XXH64_update(f.hash, buf.get(), n);
      ++turn_;
      turn_cv_.notify_all();
      lock.unlock();
      ReportProgress(n);
    }
  }

  Files& files_;
  const std::vector<Chunk>& chunks_;
  const uint64_t chunk_;
  const bool start_writeback_;
  const int64_t direct_run_;
  std::atomic<std::size_t> next_{0};
  std::mutex mu_;
  std::condition_variable turn_cv_;
  std::size_t turn_ = 0;  // guarded by mu_: the next chunk to hash
  bool failed_ = false;   // guarded by mu_
  Status error_;          // guarded by mu_
};

// Syncs every file (in parallel: on a disk each waits for its own writeback), closes
// them and moves them to their final names (then syncs their directory). Returns each
// file's hash.
Result<std::vector<std::string>> SyncAndRename(Files& files,
                                               const std::vector<std::string>& paths) {
  std::vector<Status> synced(files.files.size());
  {
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < files.files.size(); ++i) {
      threads.emplace_back([&, i] {
        if (::fsync(files.files[i].fd) != 0)
          synced[i] = ErrnoError("fsync " + files.files[i].tmp, errno);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  for (Status& s : synced) TP_RETURN_IF_ERROR(s);
  std::vector<std::string> sums;
  for (OutFile& f : files.files) {
    sums.push_back(HashHex(XXH64_digest(f.hash)));
    if (::close(f.fd) != 0) {
      f.fd = -1;
      return ErrnoError("close " + f.tmp, errno);
    }
    f.fd = -1;
  }
  for (OutFile& f : files.files) {
    if (::rename(f.tmp.c_str(), f.path.c_str()) != 0)
      return ErrnoError("rename " + f.tmp + " to " + f.path, errno);
    f.tmp = f.path;  // on a later error the renamed file goes too
  }
  if (!paths.empty())
    TP_RETURN_IF_ERROR(SyncDir(std::filesystem::path(paths.front()).parent_path().string()));
  return sums;
}

}  // namespace

bool CanStreamPlan(const plan::Plan& plan) {
  return std::none_of(plan.ops.begin(), plan.ops.end(),
                      [](const CopyOp& op) { return op.src_new; });
}

Result<std::vector<std::string>> WriteRankFilesStreamed(
    const plan::Plan& plan, const Layout& from, const Layout& to,
    const std::vector<std::vector<StreamSource>>& src, const std::vector<std::string>& paths,
    const StreamOptions& options) {
  Files files;
  TP_RETURN_IF_ERROR(Prepare(plan, from, to, src, paths, files));
  const uint64_t chunk = std::max<std::size_t>(options.chunk_bytes, 1);
  const std::vector<Chunk> chunks = ChunksOf(files, chunk);
  ChunkWriter writer(files, chunks, chunk, StartsWriteback(files),
                     static_cast<int64_t>(std::max<std::size_t>(options.direct_run_bytes, 1)));
  const int nt = std::min<int>(
      Threads(options), static_cast<int>(std::max<std::size_t>(chunks.size(), std::size_t{1})));
  TP_RETURN_IF_ERROR(writer.Run(nt));
  TP_ASSIGN_OR_RETURN(std::vector<std::string> sums, SyncAndRename(files, paths));
  files.keep = true;
  return sums;
}

}  // namespace tenplex::transform
