#include <set>

#include "tenplex/store/store_internal.h"
#include "tenplex/util/file.h"

namespace tenplex::store {

struct PendingTensor {
  TensorPath path;
  uint64_t bytes = 0;
  std::string tmp;
  std::shared_ptr<ShmMapping> map;
};

namespace {

// Creates `file` (sparse, `bytes` long) and lets fill write it; it must write exactly
// `bytes` bytes.
Status FillFile(const std::string& file, uint64_t bytes,
                const std::function<Status(TensorSink&)>& fill) {
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("create " + file, errno);
  Status s;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) s = ErrnoError("ftruncate " + file, errno);
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

// Writes p's bytes into the temporary file `tmp`: from fill, else allocated and (with
// map) mapped writable into p.map. p.tmp is set once there is a file to remove.
Status WriteTmp(PendingTensor& p, const std::string& tmp,
                const std::function<Status(TensorSink&)>* fill, bool map) {
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

Status Store::Impl::ReserveForCreate(const std::vector<PendingTensor>& pend, uint64_t total) {
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
  if (total > limit || used > limit - total) {
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
                                                    bool /*zero_fill: always allocated*/) {
  uint64_t total = 0;
  TP_ASSIGN_OR_RETURN(std::vector<PendingTensor> pend, SizeRequests(reqs, &total));
  if (fill && reqs.size() != 1) return Internal("Store: a filled create takes one tensor");
  TP_RETURN_IF_ERROR(ReserveForCreate(pend, total));
  for (PendingTensor& p : pend) {
    Status s = WriteTmp(p, TmpName(), fill, maps != nullptr);
    if (s.ok()) continue;
    for (PendingTensor& q : pend) {
      if (!q.tmp.empty()) ::unlink(q.tmp.c_str());
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
    Status s = MakeDir(vdir + "/" + RankSegment(p.path.rank));
    if (s.ok() && ::rename(p.tmp.c_str(), file.c_str()) != 0)
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
    vs->bytes += e.bytes;
    auto ins = vs->tensors.emplace(key, std::move(e)).first;
    out.push_back(MakeInfo(p.path.job, num, *vs, ins->first, ins->second));
    if (maps) maps->push_back(p.map);
  }
  return out;
}

}  // namespace tenplex::store
