// Safetensors files: an 8-byte little-endian header length N, N bytes of JSON
// {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "value"}}, then the data; offsets are relative to the
// first byte after the header.
//
// The reader maps the file and validates the header before any use: the header fits
// in the file and is a JSON object of well-formed entries, dtypes are known, shapes
// are non-negative without overflow, every range lies inside the data and has exactly
// dtype size x volume bytes, and no two ranges overlap. The writer writes to a
// temporary name, fsyncs and renames.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tenplex/geometry/box.h"
#include "tenplex/geometry/dtype.h"
#include "tenplex/util/file.h"
#include "tenplex/util/status.h"

namespace tenplex::io {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // relative to the data section
  uint64_t end = 0;
  uint64_t bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + N: where the data section starts in the file
};

// Maximum accepted header length (100 MiB, as the reference implementation).
inline constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;

// Parses and validates a header from the first `size` bytes of a file image
// (`size` is the whole file size; the data section must hold every range).
Result<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, std::size_t size);
// Encodes a header for `tensors` laid out back to back in the given order (their
// begin/end are recomputed); returns the 8-byte length prefix plus JSON, padded with
// spaces to a multiple of 8 bytes.
std::string EncodeSafetensorsHeader(std::vector<SafetensorsEntry>& tensors,
                                    const std::map<std::string, std::string>& metadata);

// A validated, memory-mapped safetensors file.
class SafetensorsFile {
 public:
  // Only a regular file (util/file.h OpenRegularFile: no symbolic link, FIFO, directory).
  static Result<SafetensorsFile> Open(const std::string& path);
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<SafetensorsEntry>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // The entry with this name, or nullptr.
  const SafetensorsEntry* Find(const std::string& name) const;
  const uint8_t* data(const SafetensorsEntry& e) const {
    return file_.data() + header_.data_offset + e.begin;
  }
  const std::string& path() const { return file_.path(); }
  // The whole file as mapped (for hashing it).
  const MappedFile& file() const { return file_; }

 private:
  MappedFile file_;
  SafetensorsHeader header_;
  std::map<std::string, std::size_t> index_;
};

struct TensorData {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  const void* data = nullptr;  // Volume(shape) * DTypeSize(dtype) bytes
};

// Writes a safetensors file atomically (temp file, fsync, rename).
Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// Creates a safetensors file in place: the file is reserved on disk (posix_fallocate: a
// full disk fails here with ResourceExhausted, never a SIGBUS later), sized and mapped
// writable under a temporary name, callers fill each tensor's bytes through data(i), and Commit()
// syncs and renames it to its final name. Destroying an uncommitted writer removes
// the temporary file.
class SafetensorsWriter {
 public:
  static Result<SafetensorsWriter> Create(const std::string& path,
                                          std::vector<SafetensorsEntry> tensors,
                                          const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) = delete;
  ~SafetensorsWriter();

  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }
  uint8_t* data(std::size_t i) { return base_ + data_offset_ + tensors_[i].begin; }
  Status Commit();

 private:
  SafetensorsWriter() = default;
  std::string path_, tmp_;
  std::vector<SafetensorsEntry> tensors_;
  uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  uint64_t data_offset_ = 0;
  int fd_ = -1;
};

}  // namespace tenplex::io
