#include "tenplex/data/megatron.h"

#include <cstring>

namespace tenplex::data {

namespace {

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Append(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

std::string N(uint64_t v) { return std::to_string(v); }

}  // namespace

Result<MegatronDType> MegatronDTypeFromCode(uint8_t code) {
  switch (code) {
    case 1:
      return MegatronDType{1, "uint8", 1, false};
    case 2:
      return MegatronDType{2, "int8", 1, false};
    case 3:
      return MegatronDType{3, "int16", 2, false};
    case 4:
      return MegatronDType{4, "int32", 4, false};
    case 5:
      return MegatronDType{5, "int64", 8, false};
    case 6:
      return MegatronDType{6, "float64", 8, true};
    case 7:
      return MegatronDType{7, "float32", 4, true};
    case 8:
      return MegatronDType{8, "uint16", 2, false};
  }
  return DataLoss("unknown Megatron dtype code " + N(code) + " (known: 1..8)");
}

std::string EncodeMegatronHeader(uint8_t dtype_code, uint64_t n, uint64_t d) {
  std::string s(kMegatronMagic);
  Append<uint64_t>(&s, kMegatronVersion);
  Append<uint8_t>(&s, dtype_code);
  Append<uint64_t>(&s, n);
  Append<uint64_t>(&s, d);
  return s;
}

Result<MegatronLayout> ParseMegatronIndex(const uint8_t* idx, std::size_t idx_size,
                                          uint64_t bin_size) {
  if (idx_size < kMegatronHeaderBytes) {
    return DataLoss("index has " + N(idx_size) + " bytes, fewer than the " +
                    N(kMegatronHeaderBytes) + "-byte header");
  }
  if (std::memcmp(idx, kMegatronMagic.data(), kMegatronMagic.size()) != 0) {
    return DataLoss("not a Megatron index: bad magic (expected \"MMIDIDX\\0\\0\")");
  }
  const uint64_t version = Load<uint64_t>(idx + 9);
  if (version != kMegatronVersion) return DataLoss("unsupported index version " + N(version));
  MegatronLayout l;
  TP_ASSIGN_OR_RETURN(l.dtype, MegatronDTypeFromCode(idx[17]));
  const uint64_t n = Load<uint64_t>(idx + 18), d = Load<uint64_t>(idx + 26);
  l.num_sequences = n;
  l.num_document_entries = d;
  // Sizes without overflow: the counts are bounded by the file size first.
  const uint64_t body = idx_size - kMegatronHeaderBytes;
  if (n > body / 12 || d > body / 8) {
    return DataLoss("index counts (" + N(n) + " sequences, " + N(d) +
                    " document entries) do not fit in its " + N(idx_size) + " bytes");
  }
  const uint64_t base = kMegatronHeaderBytes + 12 * n + 8 * d;
  if (idx_size == base) {
    l.has_modes = false;
  } else if (idx_size == base + n && n > 0) {
    l.has_modes = true;
  } else {
    return DataLoss("index has " + N(idx_size) + " bytes but its counts (" + N(n) + " sequences, " +
                    N(d) + " document entries) imply " + N(base) + " (or " + N(base + n) +
                    " with modes)");
  }
  const uint8_t* lengths = idx + kMegatronHeaderBytes;
  const uint8_t* pointers = lengths + 4 * n;
  const uint8_t* docs = pointers + 8 * n;
  for (uint64_t i = 0; i < n; ++i) {
    const int32_t len = Load<int32_t>(lengths + 4 * i);
    const int64_t ptr = Load<int64_t>(pointers + 8 * i);
    if (len < 0)
      return DataLoss("sequence " + N(i) + " has negative length " + std::to_string(len));
    if (ptr < 0 || static_cast<uint64_t>(ptr) > bin_size ||
        static_cast<uint64_t>(len) * l.dtype.size > bin_size - static_cast<uint64_t>(ptr)) {
      return DataLoss("sequence " + N(i) + " (pointer " + std::to_string(ptr) + ", " +
                      std::to_string(len) + " tokens of " + N(l.dtype.size) +
                      " bytes) lies outside the " + N(bin_size) + "-byte data file");
    }
  }
  if (d == 0) return DataLoss("document index is empty (it must start with 0 and end with n)");
  int64_t prev = 0;
  for (uint64_t k = 0; k < d; ++k) {
    const int64_t v = Load<int64_t>(docs + 8 * k);
    if ((k == 0 && v != 0) || v < prev || static_cast<uint64_t>(v) > n) {
      return DataLoss("document index entry " + N(k) + " = " + std::to_string(v) +
                      " is not a non-decreasing sequence index from 0 to " + N(n));
    }
    prev = v;
  }
  if (static_cast<uint64_t>(prev) != n) {
    return DataLoss("document index ends at " + std::to_string(prev) +
                    ", not at the sequence count " + N(n));
  }
  return l;
}

std::string MegatronPrefix(const std::string& path) {
  auto ends = [&](const char* suffix) {
    const std::size_t k = std::strlen(suffix);
    return path.size() >= k && path.compare(path.size() - k, k, suffix) == 0;
  };
  if (ends(".bin") || ends(".idx")) return path.substr(0, path.size() - 4);
  return path;
}

Result<MegatronDataset> MegatronDataset::Open(const std::string& prefix_or_file) {
  MegatronDataset m;
  m.prefix_ = MegatronPrefix(prefix_or_file);
  TP_ASSIGN_OR_RETURN(m.idx_, MappedFile::Open(m.prefix_ + ".idx"));
  TP_ASSIGN_OR_RETURN(m.bin_, MappedFile::Open(m.prefix_ + ".bin"));
  auto layout = ParseMegatronIndex(m.idx_.data(), m.idx_.size(), m.bin_.size());
  if (!layout.ok()) return layout.status().WithContext(m.prefix_ + ".idx");
  m.layout_ = *layout;
  return m;
}

int32_t MegatronDataset::length(uint64_t i) const {
  return Load<int32_t>(idx_.data() + kMegatronHeaderBytes + 4 * i);
}

int64_t MegatronDataset::pointer(uint64_t i) const {
  return Load<int64_t>(idx_.data() + kMegatronHeaderBytes + 4 * layout_.num_sequences + 8 * i);
}

int64_t MegatronDataset::document_entry(uint64_t d) const {
  return Load<int64_t>(idx_.data() + kMegatronHeaderBytes + 12 * layout_.num_sequences + 8 * d);
}

std::string_view MegatronDataset::sequence(uint64_t i) const {
  const uint64_t bytes = static_cast<uint64_t>(length(i)) * layout_.dtype.size;
  if (bytes == 0) return {};
  return {reinterpret_cast<const char*>(bin_.data()) + pointer(i), bytes};
}

}  // namespace tenplex::data
