#include "tenplex/data/dataset.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "tenplex/util/file.h"
#include "tenplex/util/json_depth.h"

namespace tenplex::data {

namespace fs = std::filesystem;
using nlohmann::json;

Result<DataFormat> ParseDataFormat(std::string_view name) {
  if (name == "jsonl") return DataFormat::kJsonl;
  if (name == "megatron") return DataFormat::kMegatron;
  return InvalidArgument("unknown dataset format \"" + std::string(name) +
                         "\" (jsonl or megatron)");
}

std::string_view DataFormatName(DataFormat f) {
  return f == DataFormat::kJsonl ? "jsonl" : "megatron";
}

namespace {

Result<std::string> Absolute(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) return InvalidArgument("bad path " + path + ": " + ec.message());
  return p.lexically_normal().string();
}

Status MakeDir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InvalidArgument("cannot create directory " + dir + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

Status BuildIndex(const std::string& input, DataFormat format, const std::string& out_dir) {
  json j = {{"tenplex_data_index", kIndexVersion}, {"format", DataFormatName(format)}};
  if (format == DataFormat::kJsonl) {
    TP_ASSIGN_OR_RETURN(std::string source, Absolute(input));
    TP_ASSIGN_OR_RETURN(MappedFile src, MappedFile::Open(source));
    auto offsets =
        BuildJsonlOffsets(std::string_view(reinterpret_cast<const char*>(src.data()), src.size()));
    if (!offsets.ok()) return offsets.status().WithContext(source);
    TP_RETURN_IF_ERROR(MakeDir(out_dir));
    TP_RETURN_IF_ERROR(WriteFileAtomic(out_dir + "/offsets.bin", *offsets));
    uint64_t n;
    std::memcpy(&n, offsets->data() + 16, 8);
    j["source"] = source;
    j["source_bytes"] = src.size();
    j["num_samples"] = n;
  } else {
    TP_ASSIGN_OR_RETURN(std::string prefix, Absolute(MegatronPrefix(input)));
    TP_ASSIGN_OR_RETURN(MegatronDataset m, MegatronDataset::Open(prefix));
    TP_RETURN_IF_ERROR(MakeDir(out_dir));
    j["prefix"] = prefix;
    j["bin_bytes"] = m.bin_bytes();
    j["idx_bytes"] = m.idx_bytes();
    j["dtype"] = m.dtype().name;
    j["num_samples"] = m.num_sequences();
    j["num_documents"] = m.layout().num_document_entries - 1;
  }
  return WriteFileAtomic(out_dir + "/index.json", j.dump(2) + "\n");
}

Result<std::shared_ptr<const Dataset>> Dataset::Open(const std::string& index_dir) {
  const std::string meta_path = index_dir + "/index.json";
  if (!fs::exists(meta_path)) {
    return NotFound(index_dir +
                    " is not a dataset index (no index.json; build one with `tenplex data index`)");
  }
  TP_ASSIGN_OR_RETURN(std::string text, ReadFile(meta_path));
  TP_RETURN_IF_ERROR(CheckJsonDepth(text, meta_path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) { return DataLoss(meta_path + ": " + what); };
  if (!j.is_object()) return bad("not a JSON object");
  auto field_u64 = [&](const char* key) -> Result<uint64_t> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned())
      return bad(std::string("missing or bad \"") + key + "\"");
    return it->get<uint64_t>();
  };
  auto field_str = [&](const char* key) -> Result<std::string> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string())
      return bad(std::string("missing or bad \"") + key + "\"");
    return it->get<std::string>();
  };
  TP_ASSIGN_OR_RETURN(uint64_t version, field_u64("tenplex_data_index"));
  if (version != kIndexVersion) return bad("unsupported index version " + std::to_string(version));
  TP_ASSIGN_OR_RETURN(std::string format_name, field_str("format"));
  auto format = ParseDataFormat(format_name);
  if (!format.ok()) return bad(format.status().message());
  TP_ASSIGN_OR_RETURN(uint64_t n, field_u64("num_samples"));
  auto d = std::make_shared<Dataset>();
  d->format_ = *format;
  if (d->format_ == DataFormat::kJsonl) {
    TP_ASSIGN_OR_RETURN(std::string source, field_str("source"));
    TP_ASSIGN_OR_RETURN(uint64_t source_bytes, field_u64("source_bytes"));
    TP_ASSIGN_OR_RETURN(JsonlDataset jd, JsonlDataset::Open(source, index_dir + "/offsets.bin"));
    if (jd.num_samples() != n || jd.source_bytes() != source_bytes) {
      return bad("num_samples/source_bytes do not match offsets.bin and the source");
    }
    d->jsonl_ = std::move(jd);
  } else {
    TP_ASSIGN_OR_RETURN(std::string prefix, field_str("prefix"));
    TP_ASSIGN_OR_RETURN(uint64_t bin_bytes, field_u64("bin_bytes"));
    TP_ASSIGN_OR_RETURN(uint64_t idx_bytes, field_u64("idx_bytes"));
    TP_ASSIGN_OR_RETURN(MegatronDataset md, MegatronDataset::Open(prefix));
    if (md.bin_bytes() != bin_bytes || md.idx_bytes() != idx_bytes) {
      return DataLoss(prefix +
                      ".bin/.idx changed since indexing (sizes differ), rebuild the index");
    }
    if (md.num_sequences() != n) return bad("num_samples does not match " + prefix + ".idx");
    d->megatron_ = std::move(md);
  }
  return std::shared_ptr<const Dataset>(std::move(d));
}

uint64_t Dataset::num_samples() const {
  return jsonl_ ? jsonl_->num_samples() : megatron_->num_sequences();
}

Result<std::string_view> Dataset::Sample(uint64_t id) const {
  if (id >= num_samples()) {
    return OutOfRange("sample " + std::to_string(id) + " is out of range (the dataset has " +
                      std::to_string(num_samples()) + " samples)");
  }
  if (jsonl_) return jsonl_->line(id);
  return megatron_->sequence(id);
}

uint64_t Dataset::SampleBytes(uint64_t id) const {
  if (jsonl_) return jsonl_->line_bytes(id);
  return static_cast<uint64_t>(megatron_->length(id)) * megatron_->dtype().size;
}

Result<std::string> Dataset::SampleText(uint64_t id) const {
  TP_ASSIGN_OR_RETURN(std::string_view bytes, Sample(id));
  if (jsonl_) return std::string(bytes);
  return TokensToJson(bytes, megatron_->dtype());
}

namespace {

template <typename T>
void AppendTokens(std::string_view bytes, json* out) {
  const std::size_t n = bytes.size() / sizeof(T);
  for (std::size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
    out->push_back(v);
  }
}

}  // namespace

std::string TokensToJson(std::string_view bytes, const MegatronDType& dtype) {
  json a = json::array();
  switch (dtype.code) {
    case 1:
      AppendTokens<uint8_t>(bytes, &a);
      break;
    case 2:
      AppendTokens<int8_t>(bytes, &a);
      break;
    case 3:
      AppendTokens<int16_t>(bytes, &a);
      break;
    case 4:
      AppendTokens<int32_t>(bytes, &a);
      break;
    case 5:
      AppendTokens<int64_t>(bytes, &a);
      break;
    case 6:
      AppendTokens<double>(bytes, &a);
      break;
    case 7:
      AppendTokens<float>(bytes, &a);
      break;
    case 8:
      AppendTokens<uint16_t>(bytes, &a);
      break;
  }
  return a.dump();
}

}  // namespace tenplex::data
