// Megatron-LM indexed datasets (the "MMIDIDX" format of megatron/core/datasets/
// indexed_dataset.py): PREFIX.bin holds the token ids of all sequences back to back,
// PREFIX.idx describes them. All integers little-endian; the .idx layout is
//   offset 0   9 bytes   magic "MMIDIDX\0\0"
//          9   uint64    version, always 1
//         17   uint8     dtype code of the tokens in .bin (1 uint8, 2 int8, 3 int16,
//                        4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
//         18   uint64    sequence count n
//         26   uint64    document count d (entries of the document index below)
//         34   int32[n]  sequence lengths, in tokens
//   34 + 4n    int64[n]  sequence pointers, byte offsets into .bin
//   34 + 12n   int64[d]  document index: sequence indices where documents start, with
//                        d-1 documents; first entry 0, last entry n, non-decreasing
//   34+12n+8d  int8[n]   optional: sequence modes (multimodal datasets)
// The arrays are not aligned (34 is not a multiple of 4), so every load is a memcpy.
//
// Validation before use: magic, version, dtype code, the file size equals the size the
// counts imply (with or without the modes array: anything else is corrupt), every
// length is non-negative, every sequence [pointer, pointer + length * itemsize) lies
// inside .bin, and the document index is as stated above. Sample id = sequence index.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tenplex/util/file.h"
#include "tenplex/util/status.h"

namespace tenplex::data {

struct MegatronDType {
  uint8_t code = 0;
  const char* name = "";
  uint32_t size = 0;  // bytes per token
  bool is_float = false;
};

Result<MegatronDType> MegatronDTypeFromCode(uint8_t code);

inline constexpr std::string_view kMegatronMagic{"MMIDIDX\0\0", 9};
inline constexpr uint64_t kMegatronVersion = 1;
inline constexpr uint64_t kMegatronHeaderBytes = 34;

// The 34-byte header for an index of n sequences and d document-index entries.
std::string EncodeMegatronHeader(uint8_t dtype_code, uint64_t n, uint64_t d);

struct MegatronLayout {
  MegatronDType dtype;
  uint64_t num_sequences = 0;
  uint64_t num_document_entries = 0;
  bool has_modes = false;
};

// Validates an index image (`idx`, `idx_size` bytes) against a data file of `bin_size`
// bytes. Errors are DataLoss naming what is wrong.
Result<MegatronLayout> ParseMegatronIndex(const uint8_t* idx, std::size_t idx_size,
                                          uint64_t bin_size);

// A validated, memory-mapped PREFIX.idx + PREFIX.bin pair. Immutable; thread-safe.
class MegatronDataset {
 public:
  // `prefix` may also name PREFIX.bin or PREFIX.idx.
  static Result<MegatronDataset> Open(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  const MegatronLayout& layout() const { return layout_; }
  const MegatronDType& dtype() const { return layout_.dtype; }
  uint64_t num_sequences() const { return layout_.num_sequences; }
  uint64_t bin_bytes() const { return bin_.size(); }
  uint64_t idx_bytes() const { return idx_.size(); }

  // REQUIRES: i < num_sequences() (and d < num_document_entries()).
  int32_t length(uint64_t i) const;
  int64_t pointer(uint64_t i) const;
  int64_t document_entry(uint64_t d) const;
  // The bytes of sequence i in .bin (length(i) * itemsize bytes).
  std::string_view sequence(uint64_t i) const;

 private:
  std::string prefix_;
  MappedFile idx_, bin_;
  MegatronLayout layout_;
};

// Strips a trailing ".bin" or ".idx".
std::string MegatronPrefix(const std::string& path);

}  // namespace tenplex::data
