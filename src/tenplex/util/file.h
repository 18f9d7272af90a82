// Files: whole-file reads, atomic writes (temp file, fsync, rename, fsync of the
// directory) and read-only memory maps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/util/status.h"

namespace tenplex {

Result<std::string> ReadFile(const std::string& path);
// Writes data to path + ".tmp.<pid>.<n>", fsyncs, renames onto path, fsyncs the
// directory. A crash leaves either the old file or the new one, never a mix.
Status WriteFileAtomic(const std::string& path, std::string_view data);
// The same for the concatenation of parts (no copy into one buffer).
Status WriteFileAtomicParts(const std::string& path, const std::vector<std::string_view>& parts);
// A unique temporary name beside path: path + ".tmp.<pid>.<n>".
std::string TempNameFor(const std::string& path);
// fsyncs a directory so that renames inside it are durable.
Status SyncDir(const std::string& dir);

// A read-only private memory map of a whole file. Move-only.
class MappedFile {
 public:
  static Result<MappedFile> Open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::string path_;
};

}  // namespace tenplex
