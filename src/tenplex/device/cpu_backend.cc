// The CPU backend (backend.h): streams are worker threads with ordered queues.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "tenplex/device/backend.h"

namespace tenplex::device {
namespace {

struct Task {
  void* dst;
  const void* src;
  size_t bytes;
  uint64_t seq;
  bool fail;
};

// One stream: a thread that runs its tasks in queue order. `done` counts finished
// tasks; the first failed task's sequence number and error stay (sticky, as CUDA's).
class Stream {
 public:
  Stream() : worker_([this] { Run(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  uint64_t Push(void* dst, const void* src, size_t bytes, bool fail) {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(Task{dst, src, bytes, ++queued_, fail});
    cv_.notify_all();
    return queued_;
  }
  uint64_t queued() {
    std::lock_guard<std::mutex> l(mu_);
    return queued_;
  }
  // Waits until task `seq` is done; its error, or that of an earlier task.
  Status WaitFor(uint64_t seq) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_ >= seq; });
    if (error_seq_ != 0 && error_seq_ <= seq) return error_;
    return Status::Ok();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Task t = queue_.front();
      queue_.pop_front();
      l.unlock();
      if (!t.fail) std::memcpy(t.dst, t.src, t.bytes);
      l.lock();
      if (t.fail && error_seq_ == 0) {
        error_seq_ = t.seq;
        error_ = Internal("cpu backend: injected failure of copy " + std::to_string(t.seq) +
                          " of the stream (" + std::to_string(t.bytes) + " bytes)");
      }
      done_ = t.seq;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  uint64_t queued_ = 0;
  uint64_t done_ = 0;
  uint64_t error_seq_ = 0;
  Status error_;
  bool stop_ = false;
  std::thread worker_;
};

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& o)
      : options_(o), events_(static_cast<size_t>(std::max(o.events, 1))) {
    for (int i = 0; i < std::max(o.streams, 1); ++i) streams_.push_back(std::make_unique<Stream>());
  }
  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return "cpu (host memory, " + std::to_string(streams_.size()) + " copy threads)";
  }
  int streams() const override { return static_cast<int>(streams_.size()); }
  int events() const override { return static_cast<int>(events_.size()); }
  Status BindThread() override { return Status::Ok(); }

  Result<void*> AllocPinned(size_t bytes) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (p == nullptr)
      return ResourceExhausted("cpu backend: cannot allocate " + std::to_string(bytes) + " bytes");
    return p;
  }
  void FreePinned(void* p) override { std::free(p); }
  Result<void*> AllocDevice(size_t bytes) override { return AllocPinned(bytes); }
  void FreeDevice(void* p) override { std::free(p); }
  Status Register(void* p, size_t bytes, bool /*read_only*/) override {
    if (p == nullptr || bytes == 0) return InvalidArgument("register: empty range");
    if (options_.cpu_fail_register)
      return Unavailable("cpu backend: registration refused (injected)");
    return Status::Ok();
  }
  void Unregister(void* /*p*/) override {}

  Status CopyAsync(void* dst, const void* src, size_t bytes, Direction /*dir*/,
                   int stream) override {
    if (stream < 0 || stream >= streams())
      return InvalidArgument("copy: no stream " + std::to_string(stream));
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) return InvalidArgument("copy: null pointer");
    uint64_t n = copies_.fetch_add(1) + 1;
    streams_[static_cast<size_t>(stream)]->Push(dst, src, bytes, n == options_.cpu_fail_copy);
    return Status::Ok();
  }
  Status RecordEvent(int event, int stream) override {
    if (event < 0 || event >= events())
      return InvalidArgument("event " + std::to_string(event) + " out of range");
    if (stream < 0 || stream >= streams())
      return InvalidArgument("record: no stream " + std::to_string(stream));
    std::lock_guard<std::mutex> l(mu_);
    events_[static_cast<size_t>(event)] = {stream, streams_[static_cast<size_t>(stream)]->queued()};
    return Status::Ok();
  }
  Status WaitEvent(int event) override {
    if (event < 0 || event >= events())
      return InvalidArgument("event " + std::to_string(event) + " out of range");
    Mark m;
    {
      std::lock_guard<std::mutex> l(mu_);
      m = events_[static_cast<size_t>(event)];
    }
    if (m.stream < 0) return Status::Ok();
    return streams_[static_cast<size_t>(m.stream)]->WaitFor(m.seq);
  }
  Status Synchronize() override {
    Status first;
    for (auto& s : streams_) {
      Status st = s->WaitFor(s->queued());
      if (first.ok() && !st.ok()) first = st;
    }
    return first;
  }

 private:
  struct Mark {
    int stream = -1;
    uint64_t seq = 0;
  };
  BackendOptions options_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::mutex mu_;
  std::vector<Mark> events_;
  std::atomic<uint64_t> copies_{0};
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace tenplex::device
