#include "tenplex/io/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>

#include "tenplex/util/fd.h"
#include "tenplex/util/file.h"
#include "tenplex/util/hash.h"
#include "tenplex/util/json_depth.h"
#include "tenplex/util/json_value.h"
#include "tenplex/util/log.h"

namespace tenplex::io {

namespace fs = std::filesystem;
using nlohmann::json;

std::string RankFileName(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "rank-%05d.safetensors", rank);
  return buf;
}

Result<std::string> FileXxh64(const std::string& path) {
  TP_ASSIGN_OR_RETURN(int raw, OpenRegularFile(path));
  const Fd fd(raw);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("stat " + path, errno);
  return Xxh64HexOfFile(fd.get(), static_cast<uint64_t>(st.st_size), path);  // read, not mapped
}

namespace {

bool IsXxh64Hex(const std::string& s) {
  return s.size() == 16 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// "checksums": {"rank-00000.safetensors": "<16 hex digits>", ...}, type-checked.
Status ReadChecksums(const json& j, const std::string& path, CheckpointInfo& info) {
  auto it = j.find("checksums");
  if (it == j.end()) return Status::Ok();
  info.checksums_recorded = true;
  if (!it->is_object()) {
    return DataLoss(path + ": \"checksums\" is " + std::string(it->type_name()) +
                    ", not an object of rank file name -> xxh64 (16 hex digits)");
  }
  for (auto& [k, v] : it->items()) {
    if (!v.is_string() || !IsXxh64Hex(v.get<std::string>())) {
      return DataLoss(path + ": checksum of " + k + " is " + v.dump().substr(0, 40) +
                      ", not an xxh64 of 16 lowercase hex digits");
    }
    info.checksums[k] = v.get<std::string>();
  }
  return Status::Ok();
}

}  // namespace

Result<CheckpointInfo> ReadCheckpointInfo(const std::string& dir) {
  const std::string path = dir + "/" + kCheckpointInfoFile;
  auto text = ReadRegularFile(path);
  if (!text.ok()) {
    if (text.status().code() != StatusCode::kNotFound) return text.status();
    return NotFound(path + " is missing: " + dir + " is not a complete tenplex checkpoint (" +
                    text.status().message() + ")");
  }
  TP_RETURN_IF_ERROR(CheckJsonDepth(*text, path));
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(path + " is not a JSON object");
  if (!j.contains("model") || !j.contains("config") || !j["config"].is_string()) {
    return DataLoss(path + " needs \"model\" and \"config\"");
  }
  CheckpointInfo info;
  auto m = ModelFromJson(j["model"].dump());
  if (!m.ok()) return m.status().WithContext(path);
  info.model = std::move(m).value();
  auto c = ParseConfig(j["config"].get<std::string>());
  if (!c.ok()) return c.status().WithContext(path);
  info.config = *c;
  TP_RETURN_IF_ERROR(ReadChecksums(j, path, info));
  for (auto& [k, v] : j.items()) {
    if (k != "model" && k != "config" && k != "checksums") info.extra[k] = v;
  }
  return info;
}

Status RequireChecksums(const CheckpointInfo& info, const std::string& dir) {
  const std::string path = dir + "/" + kCheckpointInfoFile;
  const int world = info.config.world_size();
  const std::string hint =
      " (the file is not checked; reshard, store load and export take --no-verify to read it "
      "unchecked)";
  if (!info.checksums_recorded) {
    return DataLoss(path + " records no \"checksums\" (rank file -> xxh64)" + hint);
  }
  for (int r = 0; r < world; ++r) {
    if (info.checksums.count(RankFileName(r)) == 0)
      return DataLoss(path + " records no checksum for " + RankFileName(r) + hint);
  }
  for (const auto& [name, sum] : info.checksums) {
    bool rank_file = false;
    for (int r = 0; r < world && !rank_file; ++r) rank_file = name == RankFileName(r);
    if (!rank_file) {
      return DataLoss(path + " records a checksum for " + name + ", which is not a rank file of " +
                      info.config.ToString() + " (" + std::to_string(world) + " ranks)");
    }
  }
  return Status::Ok();
}

Result<std::vector<SafetensorsFile>> OpenCheckpoint(const std::string& dir, const Layout& layout,
                                                    const CheckpointInfo& info,
                                                    bool verify_checksums, ThreadPool* pool) {
  if (verify_checksums) TP_RETURN_IF_ERROR(RequireChecksums(info, dir));
  std::vector<SafetensorsFile> files;
  files.reserve(layout.ranks.size());
  for (const RankLayout& r : layout.ranks) {
    const std::string name = RankFileName(r.rank);
    const std::string path = dir + "/" + name;
    auto opened = SafetensorsFile::Open(path);
    if (!opened.ok() && opened.status().code() == StatusCode::kNotFound) {
      return NotFound("checkpoint " + dir + " lacks " + name + " (config " +
                      layout.config.ToString() + " has " + std::to_string(layout.world_size()) +
                      " ranks)");
    }
    TP_RETURN_IF_ERROR(opened.status());
    SafetensorsFile f = std::move(opened).value();
    for (const LocalTensor& t : *r.tensors) {
      const SafetensorsEntry* e = f.Find(t.name);
      if (!e)
        return DataLoss(path + " lacks tensor " + t.name + " that rank " + std::to_string(r.rank) +
                        " holds");
      if (e->dtype != t.dtype || e->shape != t.shape) {
        return DataLoss(path + ": tensor " + t.name + " is " + std::string(DTypeName(e->dtype)) +
                        " [" + ShapeToString(e->shape) + "] but the layout needs " +
                        std::string(DTypeName(t.dtype)) + " [" + ShapeToString(t.shape) + "]");
      }
    }
    files.push_back(std::move(f));
  }
  if (verify_checksums) TP_RETURN_IF_ERROR(VerifyChecksums(files, info, dir, pool));
  return files;
}

Status VerifyChecksums(const std::vector<SafetensorsFile>& files, const CheckpointInfo& info,
                       const std::string& dir, ThreadPool* pool) {
  TP_RETURN_IF_ERROR(RequireChecksums(info, dir));
  std::vector<Status> results(files.size());
  auto check = [&](std::size_t i) {
    const std::string name = fs::path(files[i].path()).filename().string();
    auto it = info.checksums.find(name);
    if (it == info.checksums.end()) {
      results[i] = DataLoss(dir + "/" + kCheckpointInfoFile + " records no checksum for " + name);
      return;
    }
    const std::string sum = Xxh64Hex(files[i].file().data(), files[i].file().size());
    if (sum != it->second) {
      results[i] = DataLoss(files[i].path() + ": xxh64 " + sum + " does not match the recorded " +
                            it->second + " (the file changed after it was written)");
    }
  };
  if (pool && files.size() > 1) {
    pool->ParallelFor(files.size(), check);
  } else {
    for (std::size_t i = 0; i < files.size(); ++i) check(i);
  }
  for (Status& s : results) TP_RETURN_IF_ERROR(s);
  return Status::Ok();
}

namespace {

// The staging directory's record of its writer: {"host", "pid", "start"} (start: the
// process's start time in clock ticks since boot, /proc/PID/stat field 22, so a reused
// pid is told apart).
constexpr char kWriterFile[] = ".tenplex-writer";

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

// Field 22 of /proc/PID/stat, or "" when the process does not exist.
std::string ProcessStart(long pid) {
  auto text = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (!text.ok()) return "";
  const std::size_t close = text->rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return "";
  std::size_t pos = close + 2;
  for (int field = 3; field < 22 && pos != std::string::npos; ++field) {
    pos = text->find(' ', pos);
    if (pos != std::string::npos) ++pos;
  }
  if (pos == std::string::npos) return "";
  return text->substr(pos, text->find(' ', pos) - pos);
}

// True when `stage` is a staging directory written by a process of this host that is
// gone (no such pid, or the pid now belongs to a process started at another time).
bool IsStaleStaging(const fs::path& stage, const std::string& host) {
  auto text = ReadRegularFile((stage / kWriterFile).string());
  if (!text.ok() || text->size() > 4096) return false;
  json w = json::parse(*text, nullptr, false);
  if (!w.is_object()) return false;
  const std::string whost = JsonValueOr<std::string>(w, "host", "");
  const long pid = JsonValueOr<long>(w, "pid", 0);
  const std::string start = JsonValueOr<std::string>(w, "start", "");
  if (whost.empty() || whost != host || pid <= 0) return false;
  if (pid == ::getpid()) return false;
  const std::string now = ProcessStart(pid);
  return now.empty() || (!start.empty() && now != start);
}

// Removes the staging directories (`*.partial-*` with a writer record) of writers on
// this host that died, from the directory a new checkpoint is written into.
void RemoveStaleStaging(const fs::path& parent) {
  const std::string host = HostName();
  std::error_code ec;
  for (fs::directory_iterator it(parent.empty() ? fs::path(".") : parent, ec), end;
       !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find(".partial-") == std::string::npos) continue;
    std::error_code sec;
    if (!fs::is_directory(it->symlink_status(sec)) || sec) continue;
    if (!IsStaleStaging(it->path(), host)) continue;
    std::error_code rec;
    fs::remove_all(it->path(), rec);
    if (!rec) LogInfo("removed %s, left by a writer that died", it->path().c_str());
  }
}

}  // namespace

Result<CheckpointWriter> CheckpointWriter::Create(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) {
    return AlreadyExists("output " + dir + " already exists and is not empty");
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return InvalidArgument("output " + dir + ": " + ec.message());
  }
  static std::atomic<int> counter{0};
  CheckpointWriter w;
  w.dir_ = dir;
  w.staging_ =
      dir + ".partial-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  fs::path parent = fs::path(dir).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  RemoveStaleStaging(parent);
  if (!fs::create_directory(w.staging_, ec) || ec) {
    return Internal("cannot create " + w.staging_ + ": " + ec.message());
  }
  w.committed_ = false;
  const json writer = {{"host", HostName()},
                       {"pid", static_cast<long>(::getpid())},
                       {"start", ProcessStart(::getpid())}};
  TP_RETURN_IF_ERROR(WriteFileAtomic(w.staging_ + "/" + kWriterFile, writer.dump() + "\n")
                         .WithContext("recording the writer of " + w.staging_));
  return w;
}

CheckpointWriter::CheckpointWriter(CheckpointWriter&& o) noexcept
    : dir_(std::move(o.dir_)), staging_(std::move(o.staging_)), committed_(o.committed_) {
  o.committed_ = true;
}

CheckpointWriter::~CheckpointWriter() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }
}

std::string CheckpointWriter::RankPath(int rank) const {
  return staging_ + "/" + RankFileName(rank);
}

Status CheckpointWriter::Commit(const CheckpointInfo& info, bool checksums) {
  if (committed_) return FailedPrecondition("checkpoint " + dir_ + " is already committed");
  json j = info.extra.is_object() ? info.extra : json::object();
  j["model"] = json::parse(ModelToJson(info.model));
  j["config"] = info.config.ToString();
  if (!checksums && !j.contains("checksums")) {
    return Internal("checkpoint writer: no checksums for " + dir_ +
                    " (every checkpoint records them)");
  }
  json sums = json::object();
  for (int r = 0; r < info.config.world_size(); ++r) {
    const std::string path = RankPath(r);
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      return Internal("checkpoint writer: " + RankFileName(r) + " was not written");
    if (checksums) {
      TP_ASSIGN_OR_RETURN(std::string sum, FileXxh64(path));
      sums[RankFileName(r)] = sum;
    }
  }
  if (checksums) j["checksums"] = sums;
  TP_RETURN_IF_ERROR(WriteFileAtomic(staging_ + "/" + kCheckpointInfoFile, j.dump(1) + "\n"));
  std::error_code ec;
  fs::remove(staging_ + "/" + kWriterFile, ec);
  if (fs::exists(dir_, ec)) fs::remove(dir_, ec);  // an empty directory (checked in Create)
  fs::rename(staging_, dir_, ec);
  if (ec) return Internal("cannot move " + staging_ + " to " + dir_ + ": " + ec.message());
  committed_ = true;
  fs::path parent = fs::path(dir_).parent_path();
  return SyncDir(parent.empty() ? "." : parent.string());
}

}  // namespace tenplex::io
