#include <algorithm>
#include <optional>
#include <set>
#include <vector>

#include "tenplex/store/beneath.h"
#include "tenplex/store/store_internal.h"
#include "tenplex/util/file.h"

namespace tenplex::store {

struct PendingTensor {
  TensorPath path;
  uint64_t bytes = 0;
  std::string tmp;
  std::shared_ptr<ShmMapping> map;
  std::optional<PoolEntry> reuse;  // a pooled file of the same job to recycle
};

namespace {

// Creates `file` (sparse, `bytes` long) and lets fill write it; it must write exactly
// `bytes` bytes.
// With `exists` the file is a recycled one, already truncated to `bytes`.
Status FillFile(const std::string& file, uint64_t bytes,
                const std::function<Status(TensorSink&)>& fill, bool exists = false) {
  int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC | (exists ? 0 : O_CREAT | O_EXCL), 0600);
  if (fd < 0) return ErrnoError("create " + file, errno);
  Status s;
  if (!exists && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
    s = ErrnoError("ftruncate " + file, errno);
  if (s.ok()) {
    TensorSink sink(fd, file, bytes);
    s = fill(sink);
    if (s.ok() && sink.written() != bytes) {
      s = InvalidArgument("got " + std::to_string(sink.written()) +
                          " bytes but dtype x shape needs " + std::to_string(bytes));
    }
  }
  ::close(fd);
  return s;
}

// The sizes of the requested tensors (their sum in *total), each checked.
Result<std::vector<PendingTensor>> SizeRequests(const std::vector<Store::AllocRequest>& reqs,
                                                uint64_t* total) {
  std::vector<PendingTensor> pend(reqs.size());
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    TP_ASSIGN_OR_RETURN(pend[i].path, ParseTensorPath(reqs[i].path));
    auto vol = CheckedVolume(reqs[i].shape, static_cast<int64_t>(DTypeSize(reqs[i].dtype)));
    if (!vol.ok()) return vol.status().WithContext(reqs[i].path);
    if (static_cast<std::size_t>(reqs[i].shape.size()) > kMaxRank) {
      return InvalidArgument(reqs[i].path + ": more than " + std::to_string(kMaxRank) +
                             " dimensions");
    }
    pend[i].bytes = static_cast<uint64_t>(*vol) * DTypeSize(reqs[i].dtype);
    *total += pend[i].bytes;  // each < 2^63, and the sum is checked against the limit later
    if (*total < pend[i].bytes) return InvalidArgument("allocation sizes overflow");
  }
  return pend;
}

// Zeroes [0, bytes) of a file with pwrite (a recycled file without a kept map: its
// pages exist, so this needs no allocation; a new map would cost page tables).
Status ZeroByPwrite(const std::string& file, uint64_t bytes) {
  static const std::vector<char> zeros(4 << 20, 0);
  int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + file, errno);
  Status s;
  for (uint64_t at = 0; at < bytes && s.ok(); at += zeros.size())
    s = PwriteFd(fd, file, at, zeros.data(), std::min<uint64_t>(zeros.size(), bytes - at));
  ::close(fd);
  return s;
}

// Recycles p.reuse (a pooled file of the same job, taken out of the pool) in place:
// it keeps its pool name until PublishCreated renames it to the tensor's (one rename,
// not two: a rename across directories takes the file system's rename lock, which
// every daemon of the machine shares). Truncated to p.bytes, then either written
// completely by fill or zeroed (through its kept map when it has one), so no byte of
// the tensor it held before stays visible. A clean file (pre-sized, never written) is
// all zeros already: truncating it only shortens it, so it is not zeroed again. Adds
// the bytes of a clean file so used to *clean. overwrite: the caller writes every byte
// before the version commits (AllocateMany with zero_fill false, e.g. a commit from a
// device through the copy engine), so the file is not zeroed either; until then it
// holds an older tensor of the same job (the pool is per job).
Status Recycle(PendingTensor& p, const std::function<Status(TensorSink&)>* fill, bool map,
               std::atomic<uint64_t>* clean, bool overwrite) {
  PoolEntry e = std::move(*p.reuse);
  p.reuse.reset();
  p.tmp = e.file;
  const std::string& tmp = p.tmp;
  if (::truncate(tmp.c_str(), static_cast<off_t>(p.bytes)) != 0)
    return ErrnoError("truncate " + tmp, errno);
  if (e.map) e.map->Shrink(p.bytes);
  if (fill) {
    TP_RETURN_IF_ERROR(FillFile(tmp, p.bytes, *fill, /*exists=*/true)
                           .WithContext(p.path.WithVersion(*p.path.version)));
    p.map = std::move(e.map);
    return Status::Ok();
  }
  if (!e.map && map) {
    auto m = ShmMapping::Map(tmp, 0, p.bytes, /*writable=*/true, /*populate=*/true);
    if (!m.ok()) return m.status();
    e.map = std::make_shared<ShmMapping>(std::move(m).value());
  }
  if (e.clean) {
    clean->fetch_add(p.bytes, std::memory_order_relaxed);
  } else if (overwrite) {
    // not zeroed: every byte is written by the caller
  } else if (e.map) {
    ParallelZero(e.map->data(), p.bytes);
  } else {
    TP_RETURN_IF_ERROR(ZeroByPwrite(tmp, p.bytes));
  }
  p.map = std::move(e.map);
  return Status::Ok();
}

// Writes p's bytes into the temporary file `tmp`: from fill, else allocated and (with
// map) mapped writable into p.map. p.tmp is set once there is a file to remove.
Status WriteTmp(PendingTensor& p, const std::string& tmp,
                const std::function<Status(TensorSink&)>* fill, bool map,
                std::atomic<uint64_t>* clean, bool overwrite) {
  if (p.reuse) {
    Status s = Recycle(p, fill, map, clean, overwrite);
    if (s.ok() || fill) return s;
    // A recycled file that failed (an internal error): a fresh one instead.
    if (!p.tmp.empty()) ::unlink(p.tmp.c_str());
    p.tmp.clear();
    p.map.reset();
  }
  if (fill) {
    Status s = FillFile(tmp, p.bytes, *fill);
    p.tmp = tmp;
    if (!s.ok()) return s.WithContext(p.path.WithVersion(*p.path.version));
  } else if (map) {
    auto m = ShmMapping::Create(tmp, p.bytes);
    if (!m.ok()) return m.status();
    p.tmp = tmp;
    p.map = std::make_shared<ShmMapping>(std::move(m).value());
  } else {
    // Always allocated, never sparse (whatever zero_fill says): a sparse tensor on a
    // full shared-memory file system gets SIGBUS in whoever maps and reads it first
    // (the daemon hashing it for /v1/meta, issue 19). A full file system is a clear
    // RESOURCE_EXHAUSTED (507) here instead.
    TP_RETURN_IF_ERROR(CreateShmFile(tmp, p.bytes, /*allocate=*/true));
    p.tmp = tmp;
  }
  return Status::Ok();
}

}  // namespace

Status Store::Impl::ReserveForCreate(std::vector<PendingTensor>& pend, uint64_t total) {
  std::lock_guard<std::mutex> lock(mu);
  std::set<std::string> seen;
  for (const PendingTensor& p : pend) {
    TP_RETURN_IF_ERROR(FindOpenVersion(p.path).status());
    if (!seen.insert(p.path.job + "/" + std::to_string(*p.path.version) + "/" + p.path.Key())
             .second) {
      return InvalidArgument("tensor '" + p.path.WithVersion(*p.path.version) +
                             "' is allocated twice in one request");
    }
  }
  // Pooled files of the job are taken first (their bytes leave the pool), then the
  // rest of the pool is evicted as far as the limit needs.
  for (PendingTensor& p : pend) p.reuse = TakePooled(p.path.job, p.bytes);
  if (!FitUnderLimit(total)) {
    for (PendingTensor& p : pend) {
      if (p.reuse) ReturnPooled(p.path.job, std::move(*p.reuse));
      p.reuse.reset();
    }
    return ResourceExhausted("memory limit: allocating " + std::to_string(total) +
                             " bytes would raise the store's " + std::to_string(used) +
                             " bytes in use above its limit of " + std::to_string(limit) +
                             " bytes (--memory-limit)");
  }
  used += total;
  return Status::Ok();
}

Result<std::vector<TensorInfo>> Store::Impl::Create(const std::vector<AllocRequest>& reqs,
                                                    const Fill* fill,
                                                    std::vector<std::shared_ptr<ShmMapping>>* maps,
                                                    bool zero_fill) {
  uint64_t total = 0;
  TP_ASSIGN_OR_RETURN(std::vector<PendingTensor> pend, SizeRequests(reqs, &total));
  if (fill && reqs.size() != 1) return Internal("Store: a filled create takes one tensor");
  Status reserved = ReserveForCreate(pend, total);
  Sweep();  // files the reservation evicted from the pool
  TP_RETURN_IF_ERROR(reserved);
  for (PendingTensor& p : pend) {
    Status s = WriteTmp(p, TmpName(), fill, maps != nullptr, &clean_reused, !zero_fill);
    if (s.ok()) continue;
    for (PendingTensor& q : pend) {
      if (!q.tmp.empty()) ::unlink(q.tmp.c_str());
      if (q.reuse) ::unlink(q.reuse->file.c_str());  // taken from the pool, not used
    }
    std::lock_guard<std::mutex> lock(mu);
    used -= total;
    return s;
  }
  return PublishCreated(reqs, pend, total, maps);
}

Result<std::vector<TensorInfo>> Store::Impl::PublishCreated(
    const std::vector<AllocRequest>& reqs, const std::vector<PendingTensor>& pend, uint64_t total,
    std::vector<std::shared_ptr<ShmMapping>>* maps) {
  std::vector<TensorInfo> out;
  std::lock_guard<std::mutex> lock(mu);
  for (const PendingTensor& p : pend) {  // all versions must still be open
    auto v = FindOpenVersion(p.path);
    if (!v.ok()) {
      Status s = v.status().WithContext("while tensors were being created");
      for (const PendingTensor& q : pend) ::unlink(q.tmp.c_str());
      used -= total;
      return s;
    }
  }
  for (std::size_t i = 0; i < pend.size(); ++i) {
    const PendingTensor& p = pend[i];
    auto [num, vs] = *FindOpenVersion(p.path);
    const std::string key = p.path.Key();
    const std::string vdir = VersionDir(p.path.job, num);
    const std::string file = vdir + "/" + key;
    Status s = MakeRankDir(vdir, p.path.rank, *vs);
    Result<ParentDir> to_dir = OpenParentBeneath(dir, file);  // no link followed (beneath.h)
    if (s.ok() && !to_dir.ok()) s = to_dir.status();
    if (s.ok() && ::renameat(AT_FDCWD, p.tmp.c_str(), to_dir->dir.get(), to_dir->name.c_str()) != 0)
      s = ErrnoError("rename " + p.tmp + " to " + file, errno);
    if (!s.ok()) {  // an internal file-system error: the tensors before i stay published
      for (std::size_t k = i; k < pend.size(); ++k) {
        ::unlink(pend[k].tmp.c_str());
        used -= pend[k].bytes;
      }
      return s;
    }
    auto old = vs->tensors.find(key);
    if (old != vs->tensors.end()) {
      used -= old->second.bytes;
      vs->bytes -= old->second.bytes;
      vs->tensors.erase(old);
    }
    Entry e;
    e.gen = counter.fetch_add(1);
    e.dtype = reqs[i].dtype;
    e.shape = reqs[i].shape;
    e.bytes = p.bytes;
    e.map = p.map;
    vs->bytes += e.bytes;
    auto ins = vs->tensors.emplace(key, std::move(e)).first;
    out.push_back(MakeInfo(p.path.job, num, *vs, ins->first, ins->second));
    if (maps) maps->push_back(p.map);
  }
  return out;
}

}  // namespace tenplex::store
