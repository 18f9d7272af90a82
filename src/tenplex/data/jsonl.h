// JSONL datasets: one JSON record per line, sample id = 0-based line number.
//
// The index is an offsets file (little-endian):
//   offset 0   8 bytes    magic "TPLXJSNL"
//          8   uint64     version, 1
//         16   uint64     n, the number of records
//         24   uint64     S, the size of the source file in bytes when indexed
//         32   uint64[n+1] off: off[i] is the byte where line i starts; off[n] is S when
//                         the source ends with a newline and S + 1 when its last line
//                         has none (as if it had one).
// Line i is the bytes [off[i], off[i+1] - 1) of the source: the newline is excluded;
// a "\r" before it is kept (the line exactly as it was). Lines are never empty, so
// off is strictly increasing by at least 2.
//
// Building the index scans the source once and checks that every line is non-empty
// and valid JSON. Opening it checks the magic, version, the file size against n, that
// off is as stated above, and that the source still has S bytes; reading a line checks
// that a newline ends it, so an edited source is a clear error, never garbage.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/util/file.h"
#include "tenplex/util/status.h"

namespace tenplex::data {

inline constexpr std::string_view kJsonlMagic{"TPLXJSNL", 8};
inline constexpr uint64_t kJsonlVersion = 1;
inline constexpr uint64_t kJsonlHeaderBytes = 32;

// Scans a source image and returns the offsets file's bytes (header and off[]).
// Errors (InvalidArgument) name the first empty or invalid line (1-based line number
// in the message, as editors count).
Result<std::string> BuildJsonlOffsets(std::string_view source);

struct JsonlOffsetsInfo {
  uint64_t num_samples = 0;
  uint64_t source_bytes = 0;
  bool last_line_unterminated = false;  // off[n] = S + 1
};

// Validates an offsets file image (everything except its agreement with the source).
// Errors are DataLoss.
Result<JsonlOffsetsInfo> CheckJsonlOffsets(const uint8_t* data, std::size_t size);

// A validated JSONL dataset: the mapped source and its mapped offsets file. Immutable;
// thread-safe.
class JsonlDataset {
 public:
  static Result<JsonlDataset> Open(const std::string& source_path, const std::string& offsets_path);

  uint64_t num_samples() const { return n_; }
  uint64_t source_bytes() const { return source_.size(); }
  // Length of line i without its newline, from the offsets alone. REQUIRES: i < n.
  uint64_t line_bytes(uint64_t i) const { return off(i + 1) - off(i) - 1; }
  // Line i without its newline. DataLoss when the source no longer matches the index.
  Result<std::string_view> line(uint64_t i) const;

 private:
  uint64_t off(uint64_t i) const;
  MappedFile source_, offsets_;
  uint64_t n_ = 0;
};

}  // namespace tenplex::data
