// tenplex._tenplex.Store: one class over the embedded store (store::Store in this
// process) and a daemon (store::Client over HTTP, with shared memory when local).
#include <pybind11/stl.h>

#include <memory>

#include "bindings.h"
#include "tenplex/store/client.h"
#include "tenplex/store/store.h"

namespace tenplex::py {
namespace {

class PyStore {
 public:
  static std::shared_ptr<PyStore> Embedded(const std::string& shm_dir, uint64_t memory_limit) {
    store::StoreOptions o;
    o.shm_dir = shm_dir;
    o.memory_limit = memory_limit;
    auto s = std::make_shared<PyStore>();
    s->store_ = Take(store::Store::Open(o));
    return s;
  }
  // coordinator: the name every request carries (store/lease.h); "" for none.
  static std::shared_ptr<PyStore> Connect(const std::string& url, const std::string& token,
                                          int timeout_s, const std::string& coordinator) {
    if (timeout_s <= 0) Check(InvalidArgument("timeout_s must be > 0"));
    store::ClientOptions o;
    o.token = token;
    o.timeout_s = timeout_s;
    o.coordinator = coordinator;
    auto s = std::make_shared<PyStore>();
    s->client_ = Take(NoGil([&] { return store::Client::Connect(url, o); }));
    return s;
  }

  bool local() const { return store_ || client_->local(); }
  std::string where() const { return store_ ? store_->shm_dir() : client_->url(); }
  // The daemon's stable host id (the embedded store's own): how hosts are matched.
  std::string host_id() const { return store_ ? store_->host_id() : client_->host_id(); }

  uint64_t BeginVersion(const std::string& job, std::optional<uint64_t> version,
                        const std::string& info) {
    return Take(NoGil([&] {
      return store_ ? store_->BeginVersion(job, version, info)
                    : client_->BeginVersion(job, version, info);
    }));
  }
  void SetVersionInfo(const std::string& job, uint64_t v, const std::string& info) {
    Check(NoGil([&] {
      return store_ ? store_->SetVersionInfo(job, v, info) : client_->SetVersionInfo(job, v, info);
    }));
  }
  // Commit and Allocate run without the GIL: a commit hashes every byte of the version
  // and an allocation zeroes recycled pages, while another thread (the training loop,
  // whose state an AsyncCommit writes) goes on.
  void Commit(const std::string& job, uint64_t v, bool keep_old) {
    Status s;
    {
      pyb::gil_scoped_release release;
      s = store_ ? store_->Commit(job, v, keep_old) : client_->Commit(job, v, keep_old);
    }
    Check(s);
  }
  void Abort(const std::string& job, uint64_t v) {
    Check(NoGil([&] { return store_ ? store_->DropVersion(job, v) : client_->Abort(job, v); }));
  }
  pyb::dict Version(const std::string& job, std::optional<uint64_t> v) {
    return VersionDict(
        Take(NoGil([&] { return store_ ? store_->Version(job, v) : client_->Version(job, v); })));
  }
  std::vector<std::string> Jobs() {
    if (store_) return store_->Jobs();
    return Take(NoGil([&] { return client_->Jobs(); }));
  }
  pyb::dict Job(const std::string& job) {
    store::JobInfo info =
        Take(NoGil([&] { return store_ ? store_->Job(job) : client_->Job(job); }));
    pyb::dict d;
    d["job"] = info.job;
    d["current"] = info.current ? pyb::cast(*info.current) : pyb::none();
    pyb::list versions;
    for (const store::VersionInfo& v : info.versions) versions.append(VersionDict(v));
    d["versions"] = versions;
    d["last_version"] = info.last;  // the highest number the job has had there
    return d;
  }
  void DeleteJob(const std::string& job) {
    Check(NoGil([&] { return store_ ? store_->DeleteJob(job) : client_->DeleteJob(job); }));
  }
  void DropVersion(const std::string& job, uint64_t v) {
    Check(
        NoGil([&] { return store_ ? store_->DropVersion(job, v) : client_->DropVersion(job, v); }));
  }
  pyb::list List(const std::string& prefix) {
    std::vector<store::TensorInfo> infos =
        Take(NoGil([&] { return store_ ? store_->List(prefix) : client_->List(prefix); }));
    pyb::list out;
    for (const auto& t : infos) out.append(InfoDict(t));
    return out;
  }
  // Creates zero-filled tensors and returns their infos (with shared-memory files).
  pyb::list Allocate(
      const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>>& reqs,
      bool zero_fill) {
    std::vector<store::Store::AllocRequest> rs;
    for (const auto& [path, dtype, shape] : reqs)
      rs.push_back({path, Take(ParseDType(dtype)), shape});
    if (!store_ && !client_->local())
      Check(FailedPrecondition("allocate needs a store on this machine (use write)"));
    Result<std::vector<store::TensorInfo>> infos = Internal("allocate: not run");
    {
      pyb::gil_scoped_release release;
      infos = store_ ? store_->AllocateMany(rs, zero_fill) : client_->Allocate(rs, zero_fill);
    }
    pyb::list out;
    for (const auto& t : Take(std::move(infos))) out.append(InfoDict(t));
    return out;
  }
  void Write(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape,
             pyb::buffer b) {
    pyb::buffer_info bi = b.request();
    const uint64_t size = static_cast<uint64_t>(bi.size) * static_cast<uint64_t>(bi.itemsize);
    DType dt = Take(ParseDType(dtype));
    if (store_) {
      Take(store_->Put(path, dt, shape, bi.ptr, size));
    } else {
      Check(NoGil([&] { return client_->Write(path, dt, shape, bi.ptr, size); }));
    }
  }
  pyb::bytes Read(const std::string& path) {
    if (store_) {
      store::TensorRef ref = Take(store_->Get(path));
      return pyb::bytes(reinterpret_cast<const char*>(ref.data()), ref.size());
    }
    std::string bytes = Take(NoGil([&] { return client_->Get(path); }));
    return pyb::bytes(bytes);
  }

 private:
  static pyb::dict VersionDict(const store::VersionInfo& vi) {
    pyb::dict d;
    d["job"] = vi.job;
    d["version"] = vi.version;
    d["committed"] = vi.committed;
    d["prepared"] = vi.prepared;
    d["current"] = vi.current;
    d["bytes"] = vi.bytes;
    d["tensors"] = vi.tensors;
    d["info"] = vi.info;
    return d;
  }
  static pyb::dict InfoDict(const store::TensorInfo& t) {
    pyb::dict d;
    d["path"] = t.path;
    d["dtype"] = std::string(DTypeName(t.dtype));
    d["shape"] = t.shape;
    d["bytes"] = t.bytes;
    d["committed"] = t.committed;
    d["file"] = t.file;
    return d;
  }
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<store::Client> client_;
};

}  // namespace

void register_store(pyb::module_& m) {
  pyb::class_<PyStore, std::shared_ptr<PyStore>>(m, "Store")
      .def_static("embedded", &PyStore::Embedded, pyb::arg("shm_dir") = "",
                  pyb::arg("memory_limit") = 0)
      .def_static("connect", &PyStore::Connect, pyb::arg("url"), pyb::arg("token") = "",
                  pyb::arg("timeout_s") = store::ClientOptions{}.timeout_s,
                  pyb::arg("coordinator") = "")
      .def_property_readonly("local", &PyStore::local)
      .def_property_readonly("where", &PyStore::where)
      .def_property_readonly("host_id", &PyStore::host_id)
      .def("begin_version", &PyStore::BeginVersion, pyb::arg("job"),
           pyb::arg("version") = pyb::none(), pyb::arg("info") = "")
      .def("set_version_info", &PyStore::SetVersionInfo)
      .def("commit", &PyStore::Commit, pyb::arg("job"), pyb::arg("version"),
           pyb::arg("keep_old") = false)
      .def("abort", &PyStore::Abort)
      .def("version", &PyStore::Version, pyb::arg("job"), pyb::arg("version") = pyb::none())
      .def("jobs", &PyStore::Jobs)
      .def("job", &PyStore::Job, pyb::arg("job"))
      .def("delete_job", &PyStore::DeleteJob, pyb::arg("job"))
      .def("drop_version", &PyStore::DropVersion, pyb::arg("job"), pyb::arg("version"))
      .def("list", &PyStore::List)
      .def("allocate", &PyStore::Allocate, pyb::arg("tensors"), pyb::arg("zero_fill") = true)
      .def("write", &PyStore::Write)
      .def("read", &PyStore::Read);
}

}  // namespace tenplex::py
