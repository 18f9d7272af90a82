// A dataset index directory, written by `tenplex data index` and read by everything
// else (the CLI, the FUSE view, python/tenplex/data.py). It holds
//   index.json    {"tenplex_data_index": 1, "format": "jsonl" | "megatron",
//                  "num_samples": n, ...format fields}, written last (atomically), so
//                  a directory with index.json is complete;
//   jsonl:        "source" (absolute path), "source_bytes", and offsets.bin (jsonl.h);
//   megatron:     "prefix" (absolute PREFIX of PREFIX.bin/.idx, which stay where they
//                  are), "bin_bytes", "idx_bytes", "dtype", "num_documents".
// Opening re-validates everything (the sizes recorded must match the files).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tenplex/data/jsonl.h"
#include "tenplex/data/megatron.h"
#include "tenplex/util/status.h"

namespace tenplex::data {

enum class DataFormat { kJsonl, kMegatron };

Result<DataFormat> ParseDataFormat(std::string_view name);
std::string_view DataFormatName(DataFormat f);

inline constexpr int kIndexVersion = 1;

// Builds the index of `input` (a JSONL file, or a Megatron PREFIX / PREFIX.bin /
// PREFIX.idx) into directory `out_dir` (created if missing).
Status BuildIndex(const std::string& input, DataFormat format, const std::string& out_dir);

// An opened, validated dataset. Immutable after Open; thread-safe.
class Dataset {
 public:
  static Result<std::shared_ptr<const Dataset>> Open(const std::string& index_dir);

  DataFormat format() const { return format_; }
  uint64_t num_samples() const;
  // The stored bytes of sample `id`: the JSONL line without its newline, or the
  // Megatron sequence's token bytes. OutOfRange for a bad id, DataLoss for a source
  // that no longer matches its index.
  Result<std::string_view> Sample(uint64_t id) const;
  // The byte size of Sample(id), from the index alone. REQUIRES: id < num_samples().
  uint64_t SampleBytes(uint64_t id) const;
  // The sample as a person reads it: the JSONL line, or a JSON array of token ids.
  Result<std::string> SampleText(uint64_t id) const;

  const JsonlDataset* jsonl() const { return jsonl_ ? &*jsonl_ : nullptr; }
  const MegatronDataset* megatron() const { return megatron_ ? &*megatron_ : nullptr; }

 private:
  DataFormat format_ = DataFormat::kJsonl;
  std::optional<JsonlDataset> jsonl_;
  std::optional<MegatronDataset> megatron_;
};

// A Megatron sequence's tokens (`bytes` in `dtype`) as a JSON array text "[1,2,3]".
std::string TokensToJson(std::string_view bytes, const MegatronDType& dtype);

}  // namespace tenplex::data
