#include "tenplex/io/checkpoint.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>

#include "tenplex/util/file.h"
#include "tenplex/util/hash.h"
#include "tenplex/util/json_depth.h"

namespace tenplex::io {

namespace fs = std::filesystem;
using nlohmann::json;

std::string RankFileName(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "rank-%05d.safetensors", rank);
  return buf;
}

Result<std::string> FileXxh64(const std::string& path) {
  TP_ASSIGN_OR_RETURN(MappedFile f, MappedFile::Open(path));
  return Xxh64Hex(f.data(), f.size());
}

Result<CheckpointInfo> ReadCheckpointInfo(const std::string& dir) {
  const std::string path = dir + "/" + kCheckpointInfoFile;
  auto text = ReadFile(path);
  if (!text.ok()) {
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
  if (j.contains("checksums") && j["checksums"].is_object()) {
    for (auto& [k, v] : j["checksums"].items()) {
      if (v.is_string()) info.checksums[k] = v.get<std::string>();
    }
  }
  for (auto& [k, v] : j.items()) {
    if (k != "model" && k != "config" && k != "checksums") info.extra[k] = v;
  }
  return info;
}

Result<std::vector<SafetensorsFile>> OpenCheckpoint(const std::string& dir, const Layout& layout,
                                                    const CheckpointInfo& info,
                                                    bool verify_checksums) {
  std::vector<SafetensorsFile> files;
  files.reserve(layout.ranks.size());
  for (const RankLayout& r : layout.ranks) {
    const std::string name = RankFileName(r.rank);
    const std::string path = dir + "/" + name;
    if (!fs::exists(path)) {
      return NotFound("checkpoint " + dir + " lacks " + name + " (config " +
                      layout.config.ToString() + " has " + std::to_string(layout.world_size()) +
                      " ranks)");
    }
    if (verify_checksums) {
      auto it = info.checksums.find(name);
      if (it != info.checksums.end() && !it->second.empty()) {
        TP_ASSIGN_OR_RETURN(std::string sum, FileXxh64(path));
        if (sum != it->second) {
          return DataLoss(path + ": xxh64 " + sum + " does not match the recorded " + it->second);
        }
      }
    }
    TP_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path));
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
  return files;
}

Result<CheckpointWriter> CheckpointWriter::Create(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) {
    return AlreadyExists("output " + dir + " already exists and is not empty");
  }
  static std::atomic<int> counter{0};
  CheckpointWriter w;
  w.dir_ = dir;
  w.staging_ =
      dir + ".partial-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  fs::path parent = fs::path(dir).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (!fs::create_directory(w.staging_, ec) || ec) {
    return Internal("cannot create " + w.staging_ + ": " + ec.message());
  }
  w.committed_ = false;
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
  json sums = json::object();
  for (int r = 0; r < info.config.world_size(); ++r) {
    const std::string path = RankPath(r);
    if (!fs::exists(path))
      return Internal("checkpoint writer: " + RankFileName(r) + " was not written");
    if (checksums) {
      TP_ASSIGN_OR_RETURN(std::string sum, FileXxh64(path));
      sums[RankFileName(r)] = sum;
    }
  }
  if (checksums) j["checksums"] = sums;
  TP_RETURN_IF_ERROR(WriteFileAtomic(staging_ + "/" + kCheckpointInfoFile, j.dump(1) + "\n"));
  std::error_code ec;
  if (fs::exists(dir_, ec)) fs::remove(dir_, ec);  // an empty directory (checked in Create)
  fs::rename(staging_, dir_, ec);
  if (ec) return Internal("cannot move " + staging_ + " to " + dir_ + ": " + ec.message());
  committed_ = true;
  fs::path parent = fs::path(dir_).parent_path();
  return SyncDir(parent.empty() ? "." : parent.string());
}

}  // namespace tenplex::io
