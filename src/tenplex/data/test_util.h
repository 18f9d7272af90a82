// Helpers for the data module's tests: temporary directories and an independent
// Megatron writer (bytes laid down by hand from the format description, sharing no
// code with megatron.cc).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tenplex/util/file.h"

namespace tenplex::data::testing {

inline std::string TempDir(const std::string& name) {
  std::string d = std::filesystem::temp_directory_path() /
                  ("tenplex-data-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

template <typename T>
void PutLE(std::string* s, T v) {
  unsigned char b[sizeof(T)];
  for (std::size_t i = 0; i < sizeof(T); ++i)
    b[i] = static_cast<unsigned char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
  s->append(reinterpret_cast<const char*>(b), sizeof(T));
}

struct MegatronFiles {
  std::string idx, bin;
};

// Sequences of uint16 tokens (dtype code 8) grouped into documents of `doc_sizes`
// sequences each; sequences are written back to back.
inline MegatronFiles WriteMegatronU16(const std::vector<std::vector<uint16_t>>& seqs,
                                      const std::vector<uint64_t>& doc_sizes) {
  MegatronFiles f;
  std::vector<int64_t> pointers;
  for (const auto& s : seqs) {
    pointers.push_back(static_cast<int64_t>(f.bin.size()));
    for (uint16_t t : s) PutLE<uint16_t>(&f.bin, t);
  }
  f.idx = std::string("MMIDIDX\0\0", 9);
  PutLE<uint64_t>(&f.idx, 1);
  PutLE<uint8_t>(&f.idx, 8);
  PutLE<uint64_t>(&f.idx, seqs.size());
  PutLE<uint64_t>(&f.idx, doc_sizes.size() + 1);
  for (const auto& s : seqs) PutLE<int32_t>(&f.idx, static_cast<int32_t>(s.size()));
  for (int64_t p : pointers) PutLE<int64_t>(&f.idx, p);
  int64_t at = 0;
  PutLE<int64_t>(&f.idx, 0);
  for (uint64_t d : doc_sizes) PutLE<int64_t>(&f.idx, at += static_cast<int64_t>(d));
  return f;
}

inline void WriteMegatron(const std::string& prefix, const MegatronFiles& f) {
  (void)WriteFileAtomic(prefix + ".idx", f.idx);
  (void)WriteFileAtomic(prefix + ".bin", f.bin);
}

}  // namespace tenplex::data::testing
