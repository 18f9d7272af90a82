#include "tenplex/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "tenplex/util/json_depth.h"

namespace tenplex::io {

using nlohmann::json;

namespace {

// One tensor's header entry, checked against the data section's size.
Result<SafetensorsEntry> ParseEntry(const std::string& name, const json& v, uint64_t data_size) {
  const std::string where = "safetensors: tensor '" + name + "'";
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
      !v.contains("data_offsets")) {
    return DataLoss(where + " needs dtype, shape and data_offsets");
  }
  SafetensorsEntry e;
  e.name = name;
  if (!v["dtype"].is_string()) return DataLoss(where + ": dtype is not a string");
  auto dt = ParseDType(v["dtype"].get<std::string>());
  if (!dt.ok()) return DataLoss(where + ": " + dt.status().message());
  e.dtype = *dt;
  if (!v["shape"].is_array()) return DataLoss(where + ": shape is not an array");
  for (const json& d : v["shape"]) {
    if (!d.is_number_integer()) return DataLoss(where + ": shape has a non-integer");
    e.shape.push_back(d.get<int64_t>());
  }
  auto bytes = CheckedVolume(e.shape, static_cast<int64_t>(DTypeSize(e.dtype)));
  if (!bytes.ok()) return DataLoss(where + ": " + bytes.status().message());
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned()) {
    return DataLoss(where + ": data_offsets must be two non-negative integers");
  }
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_size) {
    return DataLoss(where + ": data_offsets [" + std::to_string(e.begin) + ", " +
                    std::to_string(e.end) + ") lie outside the " + std::to_string(data_size) +
                    " data bytes (truncated file?)");
  }
  const uint64_t want = static_cast<uint64_t>(*bytes) * DTypeSize(e.dtype);
  if (e.end - e.begin != want) {
    return DataLoss(where + ": " + std::to_string(e.end - e.begin) + " bytes but dtype " +
                    std::string(DTypeName(e.dtype)) + " x shape [" + ShapeToString(e.shape) +
                    "] needs " + std::to_string(want));
  }
  return e;
}

// Sorts the tensors by their data offsets; tensors with bytes must not overlap.
Status SortAndCheckOverlaps(std::vector<SafetensorsEntry>& tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
            });
  for (std::size_t i = 1; i < tensors.size(); ++i) {
    const auto& a = tensors[i - 1];
    const auto& b = tensors[i];
    if (b.begin < a.end && b.bytes() > 0 && a.bytes() > 0) {
      return DataLoss("safetensors: tensors '" + a.name + "' and '" + b.name + "' overlap");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, std::size_t size) {
  if (size < 8)
    return DataLoss("safetensors: file of " + std::to_string(size) + " bytes has no header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxSafetensorsHeader) {
    return DataLoss("safetensors: header length " + std::to_string(n) +
                    " exceeds the 100 MiB limit");
  }
  if (n > size - 8) {
    return DataLoss("safetensors: header length " + std::to_string(n) +
                    " runs past the end of the file (" + std::to_string(size) +
                    " bytes); the file is truncated or corrupt");
  }
  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_size = size - h.data_offset;
  if (Status d = CheckJsonDepth(std::string_view(reinterpret_cast<const char*>(data) + 8, n),
                                "safetensors header");
      !d.ok()) {
    return DataLoss(d.message());
  }
  json j = json::parse(data + 8, data + 8 + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return DataLoss("safetensors: header is not a JSON object");
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return DataLoss("safetensors: __metadata__ must be an object of strings");
      for (auto& [k, mv] : v.items()) {
        if (!mv.is_string()) return DataLoss("safetensors: __metadata__." + k + " is not a string");
        h.metadata[k] = mv.get<std::string>();
      }
      continue;
    }
    TP_ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(name, v, data_size));
    h.tensors.push_back(std::move(e));
  }
  TP_RETURN_IF_ERROR(SortAndCheckOverlaps(h.tensors));
  return h;
}

std::string EncodeSafetensorsHeader(std::vector<SafetensorsEntry>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  json j = json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t off = 0;
  for (SafetensorsEntry& e : tensors) {
    e.begin = off;
    e.end = off + static_cast<uint64_t>(Volume(e.shape)) * DTypeSize(e.dtype);
    off = e.end;
    j[e.name] = {{"dtype", std::string(DTypeName(e.dtype))},
                 {"shape", e.shape},
                 {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = j.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile f;
  TP_ASSIGN_OR_RETURN(f.file_, MappedFile::OpenRegular(path));
  auto h = ParseSafetensorsHeader(f.file_.data(), f.file_.size());
  if (!h.ok()) return h.status().WithContext(path);
  f.header_ = std::move(h).value();
  for (std::size_t i = 0; i < f.header_.tensors.size(); ++i)
    f.index_[f.header_.tensors[i].name] = i;
  return f;
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  for (const TensorData& t : tensors) {
    TP_RETURN_IF_ERROR(CheckedVolume(t.shape, static_cast<int64_t>(DTypeSize(t.dtype))).status());
    entries.push_back({t.name, t.dtype, t.shape, 0, 0});
  }
  std::string header = EncodeSafetensorsHeader(entries, metadata);
  std::vector<std::string_view> parts{header};
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    parts.emplace_back(static_cast<const char*>(tensors[i].data), entries[i].bytes());
  }
  return WriteFileAtomicParts(path, parts);
}

Result<SafetensorsWriter> SafetensorsWriter::Create(
    const std::string& path, std::vector<SafetensorsEntry> tensors,
    const std::map<std::string, std::string>& metadata) {
  for (const SafetensorsEntry& e : tensors) {
    TP_RETURN_IF_ERROR(CheckedVolume(e.shape, static_cast<int64_t>(DTypeSize(e.dtype))).status());
  }
  SafetensorsWriter w;
  std::string header = EncodeSafetensorsHeader(tensors, metadata);
  w.path_ = path;
  w.tmp_ = TempNameFor(path);
  w.tensors_ = std::move(tensors);
  w.data_offset_ = header.size();
  w.size_ = header.size() + (w.tensors_.empty() ? 0 : w.tensors_.back().end);
  w.fd_ = ::open(w.tmp_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0) return ErrnoError("create " + w.tmp_, errno);
  // Reserved first: a full disk is an error here, not a SIGBUS when a page is filled.
  TP_RETURN_IF_ERROR(ReserveFileSpace(w.fd_, w.size_, path));
  if (::ftruncate(w.fd_, static_cast<off_t>(w.size_)) != 0)
    return ErrnoError("resize " + w.tmp_, errno);
  void* p = ::mmap(nullptr, w.size_, PROT_READ | PROT_WRITE, MAP_SHARED, w.fd_, 0);
  if (p == MAP_FAILED) return ErrnoError("mmap " + w.tmp_, errno);
  w.base_ = static_cast<uint8_t*>(p);
  std::memcpy(w.base_, header.data(), header.size());
  return w;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& o) noexcept
    : path_(std::move(o.path_)),
      tmp_(std::move(o.tmp_)),
      tensors_(std::move(o.tensors_)),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      data_offset_(o.data_offset_),
      fd_(std::exchange(o.fd_, -1)) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (base_) ::munmap(base_, size_);
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

Status SafetensorsWriter::Commit() {
  if (fd_ < 0)
    return FailedPrecondition("safetensors writer for " + path_ + " is already committed");
  if (base_ && ::msync(base_, size_, MS_SYNC) != 0) return ErrnoError("msync " + tmp_, errno);
  if (::fsync(fd_) != 0) return ErrnoError("fsync " + tmp_, errno);
  if (base_) ::munmap(base_, size_);
  base_ = nullptr;
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp_.c_str());
    return ErrnoError("rename " + tmp_ + " to " + path_, err);
  }
  return SyncDir(std::filesystem::path(path_).parent_path().string());
}

}  // namespace tenplex::io
