#include "tenplex/plan/synthetic.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace tenplex::plan {
namespace {

inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t Bits(uint64_t key, int64_t index) {
  return Mix(key + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull);
}

inline float F32Of(uint64_t x) { return static_cast<float>(x >> 40) * 0x1p-23f - 1.0f; }

template <DType D>
inline void Put(uint64_t x, uint8_t* out) {
  if constexpr (D == DType::kF64) {
    double v = static_cast<double>(x >> 11) * 0x1p-52 - 1.0;
    std::memcpy(out, &v, 8);
  } else if constexpr (D == DType::kF32) {
    float v = F32Of(x);
    std::memcpy(out, &v, 4);
  } else if constexpr (D == DType::kBF16) {
    float v = F32Of(x);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    uint16_t h = static_cast<uint16_t>(u >> 16);
    std::memcpy(out, &h, 2);
  } else if constexpr (D == DType::kF16) {
    uint16_t h =
        static_cast<uint16_t>(((x >> 63) << 15) | ((1 + (x >> 50) % 15) << 10) | (x & 0x3ff));
    std::memcpy(out, &h, 2);
  } else if constexpr (D == DType::kBool) {
    out[0] = static_cast<uint8_t>(x & 1);
  } else {
    constexpr std::size_t n = D == DType::kI64   ? 8
                              : D == DType::kI32 ? 4
                              : D == DType::kI16 ? 2
                                                 : 1;
    for (std::size_t b = 0; b < n; ++b) out[b] = static_cast<uint8_t>(x >> (8 * b));
  }
}

template <DType D>
void RunT(uint64_t key, int64_t first, int64_t n, uint8_t* out, std::size_t es) {
  for (int64_t i = 0; i < n; ++i) Put<D>(Bits(key, first + i), out + i * es);
}

// n consecutive elements from global index `first`.
void Run(DType d, uint64_t key, int64_t first, int64_t n, uint8_t* out) {
  const std::size_t es = DTypeSize(d);
  switch (d) {
    case DType::kF64:
      return RunT<DType::kF64>(key, first, n, out, es);
    case DType::kF32:
      return RunT<DType::kF32>(key, first, n, out, es);
    case DType::kF16:
      return RunT<DType::kF16>(key, first, n, out, es);
    case DType::kBF16:
      return RunT<DType::kBF16>(key, first, n, out, es);
    case DType::kI64:
      return RunT<DType::kI64>(key, first, n, out, es);
    case DType::kI32:
      return RunT<DType::kI32>(key, first, n, out, es);
    case DType::kI16:
      return RunT<DType::kI16>(key, first, n, out, es);
    case DType::kI8:
      return RunT<DType::kI8>(key, first, n, out, es);
    case DType::kU8:
      return RunT<DType::kU8>(key, first, n, out, es);
    case DType::kBool:
      return RunT<DType::kBool>(key, first, n, out, es);
  }
}

std::vector<int64_t> Strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (std::size_t k = s.size(); k > 0; --k) {
    st[k - 1] = acc;
    acc *= s[k - 1];
  }
  return st;
}

// Fills one piece, its rows [row_begin, row_end) (a row = the last dimension's run).
void FillPieceRows(const LocalTensor& t, const Piece& p, const Shape& global_shape, uint64_t key,
                   int64_t row_begin, int64_t row_end, uint8_t* data) {
  const std::size_t rank = p.global.rank(), es = DTypeSize(t.dtype);
  const bool flat = p.local.rank() != rank || p.local.extents() != p.global.extents();
  const Shape ext = p.global.extents();
  const int64_t run = rank ? ext[rank - 1] : 1;
  const std::vector<int64_t> gs = Strides(global_shape), ls = Strides(t.shape);
  std::vector<int64_t> idx(rank);
  for (int64_t q = row_begin; q < row_end; ++q) {
    int64_t rem = q, g = 0, l = 0;
    for (std::size_t k = rank; k-- > 0;) {
      const int64_t i = k + 1 == rank ? 0 : rem % ext[k];
      if (k + 1 != rank) rem /= ext[k];
      g += (p.global[k].begin + i) * gs[k];
      if (!flat) l += (p.local[k].begin + i) * ls[k];
    }
    if (flat) l = p.local[0].begin + q * run;
    Run(t.dtype, key, g, run, data + l * es);
  }
}

}  // namespace

uint64_t SyntheticKey(std::string_view tensor, uint64_t seed) {
  return XXH64(tensor.data(), tensor.size(), seed);
}

void SyntheticElement(DType dtype, uint64_t key, int64_t index, void* out) {
  Run(dtype, key, index, 1, static_cast<uint8_t*>(out));
}

Status FillSynthetic(const Layout& layout, const LocalTensor& t, uint64_t seed, void* data,
                     ThreadPool* pool) {
  uint8_t* out = static_cast<uint8_t*>(data);
  std::memset(out, 0, static_cast<std::size_t>(t.bytes()));
  for (const Piece& p : t.pieces) {
    if (IsEmpty(p.global)) continue;
    auto g = layout.globals.find(p.tensor);
    if (g == layout.globals.end())
      return InvalidArgument("piece of " + t.name + " names unknown tensor " + p.tensor);
    const Shape& shape = g->second.shape;
    const uint64_t key = SyntheticKey(p.tensor, seed);
    const int64_t run = p.global.rank() ? p.global[p.global.rank() - 1].size() : 1;
    const int64_t rows = Volume(p.global) / run;
    // About 1 MiB of elements per chunk.
    const int64_t per = std::max<int64_t>(1, (int64_t{1} << 18) / run);
    const int64_t chunks = (rows + per - 1) / per;
    auto fill = [&](std::size_t c) {
      const int64_t b = static_cast<int64_t>(c) * per;
      FillPieceRows(t, p, shape, key, b, std::min(rows, b + per), out);
    };
    if (pool && chunks > 1) {
      pool->ParallelFor(static_cast<std::size_t>(chunks), fill);
    } else {
      for (int64_t c = 0; c < chunks; ++c) fill(static_cast<std::size_t>(c));
    }
  }
  return Status::Ok();
}

Status CheckSynthetic(const Layout& layout, const LocalTensor& t, uint64_t seed, const void* data,
                      ThreadPool* pool) {
  std::vector<uint8_t> want(static_cast<std::size_t>(t.bytes()));
  TP_RETURN_IF_ERROR(FillSynthetic(layout, t, seed, want.data(), pool));
  if (std::memcmp(want.data(), data, want.size()) == 0) return Status::Ok();
  const std::size_t es = DTypeSize(t.dtype);
  std::size_t i = 0;
  while (i < want.size() &&
         std::memcmp(want.data() + i, static_cast<const uint8_t*>(data) + i, es) == 0)
    i += es;
  return DataLoss("tensor " + t.name + " element " + std::to_string(i / es) + " of " +
                  std::to_string(want.size() / es) + " differs from the synthetic content");
}

}  // namespace tenplex::plan
