#include "tenplex/runtime/warm.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tenplex/util/file.h"

namespace tenplex::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

Status PublishFile(const std::string& path, std::string_view data) {
  const std::string tmp = TempNameFor(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("create " + tmp, errno);
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoError("write " + tmp, err);
    }
    off += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError("rename " + tmp + " to " + path, err);
  }
  return Status::Ok();
}

std::string WarmWorker::Path(const char* ext) const {
  return prefix + std::to_string(seq + 1) + "." + ext;
}

WarmPool::~WarmPool() {
  parked_.insert(parked_.end(), spares_.begin(), spares_.end());
  for (const WarmWorker& w : parked_) launcher_->Kill(w.pid);
  for (const WarmWorker& w : parked_) launcher_->Wait(w.pid);
  for (pid_t pid : leaving_) launcher_->Wait(pid);  // told to exit: they do
}

WarmWorker WarmPool::NewWorker() {
  WarmWorker w;
  w.id = next_id_++;
  w.prefix = work_ + "/warm-w" + std::to_string(w.id) + "-";
  std::error_code ec;
  for (const char* ext : {"json", "abort", "parked"}) fs::remove(w.Path(ext), ec);
  return w;
}

void WarmPool::Park(std::vector<WarmWorker> workers) {
  for (WarmWorker& w : workers) parked_.push_back(std::move(w));
}

std::optional<WarmWorker> WarmPool::Take() {
  for (std::vector<WarmWorker>* from : {&parked_, &spares_}) {
    while (!from->empty()) {
      WarmWorker w = std::move(from->front());
      from->erase(from->begin());
      if (!launcher_->TryWait(w.pid)) return w;
    }
  }
  return std::nullopt;
}

Status WarmPool::StartSpares(int n, const std::vector<std::string>& command,
                             const std::string& log_dir) {
  while (static_cast<int>(spares_.size()) < n) {
    WarmWorker w = NewWorker();
    std::vector<std::string> argv = command;
    argv.insert(argv.end(), {"--warm-control", w.prefix, "--warm-spare"});
    w.log = log_dir + "/worker-spare" + std::to_string(w.id) + ".log";
    TP_ASSIGN_OR_RETURN(w.pid, launcher_->Spawn(argv, w.log));
    spares_.push_back(std::move(w));
  }
  return Status::Ok();
}

Status WarmPool::Send(WarmWorker& w, const std::vector<std::string>& args) {
  std::error_code ec;
  // The next message's files must not be left from an earlier run in this directory.
  fs::remove(w.prefix + std::to_string(w.seq + 2) + ".abort", ec);
  fs::remove(w.prefix + std::to_string(w.seq + 2) + ".parked", ec);
  fs::remove(w.prefix + std::to_string(w.seq + 2) + ".json", ec);
  TP_RETURN_IF_ERROR(PublishFile(w.Path("json"), json{{"args", args}}.dump()));
  ++w.seq;
  return Status::Ok();
}

Status WarmPool::Abort(const WarmWorker& w, bool planned) {
  return PublishFile(w.Path("abort"), planned ? R"({"stop": true})" : "{}");
}

bool WarmPool::IsParked(const WarmWorker& w) {
  std::error_code ec;
  return fs::exists(w.Path("parked"), ec);
}

void WarmPool::Release(bool wait) {
  for (const WarmWorker& w : parked_) {
    if (!PublishFile(w.Path("json"), R"({"exit": true})").ok()) launcher_->Kill(w.pid);
    leaving_.push_back(w.pid);
  }
  parked_.clear();
  if (wait) {
    for (const WarmWorker& w : spares_) {
      if (!PublishFile(w.Path("json"), R"({"exit": true})").ok()) launcher_->Kill(w.pid);
      leaving_.push_back(w.pid);
    }
    spares_.clear();
    for (pid_t pid : leaving_) launcher_->Wait(pid);
    leaving_.clear();
  } else {
    ReapLeaving();
  }
}

void WarmPool::ReapLeaving() {
  std::vector<pid_t> still;
  for (pid_t pid : leaving_) {
    if (!launcher_->TryWait(pid)) still.push_back(pid);
  }
  leaving_ = std::move(still);
}

}  // namespace tenplex::runtime
