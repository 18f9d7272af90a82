#include "tenplex/data/view.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

namespace tenplex::data {

// Rank r's records: record k is sample perm[(j0 + k / s) * B + begin + k % s] where s is
// the slice size and j0 the first batch in the epoch.
struct DatasetView::RankRecords {
  std::shared_ptr<const Permutation> perm;
  uint64_t global_batch = 0, first_batch = 0, steps = 0;
  Slice slice;
  uint64_t per_step() const { return slice.size(); }
  uint64_t count() const { return steps * per_step(); }
  uint64_t Id(uint64_t k) const {
    const uint64_t s = per_step();
    return (*perm)[(first_batch + k / s) * global_batch + slice.begin + k % s];
  }
};

namespace {

using RankRecords = DatasetView::RankRecords;

// Record k's bytes in a file: a JSONL line plus "\n", or a Megatron sequence.
class RecordSource {
 public:
  explicit RecordSource(std::shared_ptr<const Dataset> d) : d_(std::move(d)) {
    newline_ = d_->format() == DataFormat::kJsonl ? 1 : 0;
  }
  uint64_t Size(uint64_t id) const { return d_->SampleBytes(id) + newline_; }
  // Copies bytes [from, from + n) of the record of sample `id` to out.
  Status Copy(uint64_t id, uint64_t from, uint64_t n, char* out) const {
    TP_ASSIGN_OR_RETURN(std::string_view body, d_->Sample(id));
    if (from < body.size()) {
      const uint64_t k = std::min<uint64_t>(n, body.size() - from);
      std::memcpy(out, body.data() + from, k);
      out += k;
      n -= k;
    }
    if (n > 0) *out = '\n';  // only JSONL records extend past the body, by one byte
    return Status::Ok();
  }

 private:
  std::shared_ptr<const Dataset> d_;
  uint64_t newline_ = 0;
};

// The concatenation of a rank's records (samples.jsonl, samples.bin).
class RecordsFile : public ViewFile {
 public:
  RecordsFile(RankRecords r, RecordSource src) : r_(std::move(r)), src_(std::move(src)) {
    step_start_.reserve(r_.steps + 1);
    uint64_t pos = 0;
    for (uint64_t t = 0; t < r_.steps; ++t) {
      step_start_.push_back(pos);
      for (uint64_t k = t * r_.per_step(); k < (t + 1) * r_.per_step(); ++k)
        pos += src_.Size(r_.Id(k));
    }
    step_start_.push_back(pos);
  }

  uint64_t size() const override { return step_start_.back(); }

  // Byte offset where record k starts.
  uint64_t RecordStart(uint64_t k) const {
    const uint64_t t = k / r_.per_step();
    uint64_t pos = step_start_[t];
    for (uint64_t i = t * r_.per_step(); i < k; ++i) pos += src_.Size(r_.Id(i));
    return pos;
  }
  uint64_t RecordSize(uint64_t k) const { return src_.Size(r_.Id(k)); }
  const RankRecords& records() const { return r_; }

  Result<std::size_t> Read(uint64_t offset, std::size_t len, char* out) const override {
    if (offset >= size() || len == 0) return std::size_t{0};
    len = static_cast<std::size_t>(std::min<uint64_t>(len, size() - offset));
    // The last step starting at or before offset (steps may be empty only if all its
    // records are empty, and then upper_bound skips them).
    const auto it = std::upper_bound(step_start_.begin(), step_start_.end(), offset);
    const uint64_t t = static_cast<uint64_t>(it - step_start_.begin()) - 1;
    uint64_t pos = step_start_[t];
    std::size_t done = 0;
    for (uint64_t k = t * r_.per_step(); done < len && k < r_.count(); ++k) {
      const uint64_t id = r_.Id(k);
      const uint64_t rs = src_.Size(id);
      const uint64_t want = offset + done;
      if (pos + rs > want) {
        const uint64_t from = want - pos;
        const uint64_t n = std::min<uint64_t>(rs - from, len - done);
        TP_RETURN_IF_ERROR(src_.Copy(id, from, n, out + done));
        done += n;
      }
      pos += rs;
    }
    return done;
  }

 private:
  RankRecords r_;
  RecordSource src_;
  std::vector<uint64_t> step_start_;
};

// An MMIDIDX index of a RecordsFile of Megatron sequences (samples.idx): header,
// int32 lengths, int64 pointers, and the document index 0, 1, ..., n.
class MegatronIdxFile : public ViewFile {
 public:
  MegatronIdxFile(const RecordsFile* bin, const MegatronDType& dtype)
      : bin_(bin), n_(bin->records().count()), item_(dtype.size) {
    header_ = EncodeMegatronHeader(dtype.code, n_, n_ + 1);
  }

  uint64_t size() const override { return kMegatronHeaderBytes + 12 * n_ + 8 * (n_ + 1); }

  Result<std::size_t> Read(uint64_t offset, std::size_t len, char* out) const override {
    if (offset >= size() || len == 0) return std::size_t{0};
    len = static_cast<std::size_t>(std::min<uint64_t>(len, size() - offset));
    const uint64_t end = offset + len;
    // Header.
    Copy(0, header_.data(), header_.size(), offset, end, out);
    // Lengths.
    const uint64_t lengths_at = kMegatronHeaderBytes, pointers_at = lengths_at + 4 * n_,
                   docs_at = pointers_at + 8 * n_;
    Elements(lengths_at, 4, n_, offset, end, out, [&](uint64_t k0, uint64_t k1, auto&& emit) {
      for (uint64_t k = k0; k < k1; ++k) emit(k, static_cast<int32_t>(bin_->RecordSize(k) / item_));
    });
    Elements(pointers_at, 8, n_, offset, end, out, [&](uint64_t k0, uint64_t k1, auto&& emit) {
      int64_t p = static_cast<int64_t>(bin_->RecordStart(k0));
      for (uint64_t k = k0; k < k1; ++k) {
        emit(k, p);
        p += static_cast<int64_t>(bin_->RecordSize(k));
      }
    });
    Elements(docs_at, 8, n_ + 1, offset, end, out, [&](uint64_t k0, uint64_t k1, auto&& emit) {
      for (uint64_t k = k0; k < k1; ++k) emit(k, static_cast<int64_t>(k));
    });
    return len;
  }

 private:
  // Copies the part of bytes [at, at + n) of the file that lies in [offset, end).
  static void Copy(uint64_t at, const void* src, uint64_t n, uint64_t offset, uint64_t end,
                   char* out) {
    const uint64_t lo = std::max(at, offset), hi = std::min(at + n, end);
    if (lo < hi)
      std::memcpy(out + (lo - offset), static_cast<const char*>(src) + (lo - at), hi - lo);
  }
  // An array of `count` elements of `width` bytes at file offset `at`: asks `gen` for
  // the elements overlapping [offset, end) and copies the overlapping bytes.
  template <typename Gen>
  static void Elements(uint64_t at, uint64_t width, uint64_t count, uint64_t offset, uint64_t end,
                       char* out, Gen&& gen) {
    const uint64_t lo = std::max(at, offset), hi = std::min(at + width * count, end);
    if (lo >= hi) return;
    const uint64_t k0 = (lo - at) / width, k1 = (hi - at + width - 1) / width;
    gen(k0, k1, [&](uint64_t k, auto value) {
      static_assert(sizeof(value) <= 8);
      Copy(at + k * width, &value, width, offset, end, out);
    });
  }

  const RecordsFile* bin_;
  uint64_t n_, item_;
  std::string header_;
};

class StringFile : public ViewFile {
 public:
  explicit StringFile(std::string s) : s_(std::move(s)) {}
  uint64_t size() const override { return s_.size(); }
  Result<std::size_t> Read(uint64_t offset, std::size_t len, char* out) const override {
    if (offset >= s_.size()) return std::size_t{0};
    const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(len, s_.size() - offset));
    std::memcpy(out, s_.data() + offset, n);
    return n;
  }

 private:
  std::string s_;
};

}  // namespace

Result<std::string> ReadAll(const ViewFile& f) {
  std::string s(f.size(), '\0');
  std::size_t done = 0;
  while (done < s.size()) {
    TP_ASSIGN_OR_RETURN(std::size_t n, f.Read(done, s.size() - done, s.data() + done));
    if (n == 0) return Internal("short read from a view file");
    done += n;
  }
  return s;
}

std::string DatasetView::RankDir(uint64_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05llu", static_cast<unsigned long long>(rank));
  return buf;
}

Result<std::shared_ptr<const DatasetView>> DatasetView::Create(
    std::shared_ptr<const Dataset> dataset, const ViewSpec& spec) {
  TP_ASSIGN_OR_RETURN(GlobalOrder order,
                      GlobalOrder::Create({dataset->num_samples(), spec.seed, spec.global_batch}));
  TP_ASSIGN_OR_RETURN(StepInfo first, order.Locate(spec.start_sample));
  TP_RETURN_IF_ERROR(WeightedRankSlice(spec.global_batch, spec.dp, spec.dp_weights, 0).status());
  std::shared_ptr<DatasetView> v(new DatasetView());
  v->spec_ = spec;
  v->first_ = first;
  v->steps_ = order.batches_per_epoch() - first.batch_in_epoch;
  v->dataset_ = dataset;
  v->perm_ = std::make_shared<const Permutation>(
      Permutation::ForEpoch(dataset->num_samples(), spec.seed, first.epoch));

  nlohmann::json info = {{"format", DataFormatName(dataset->format())},
                         {"num_samples", dataset->num_samples()},
                         {"seed", spec.seed},
                         {"global_batch", spec.global_batch},
                         {"dp", spec.dp},
                         {"start_sample", spec.start_sample},
                         {"epoch", first.epoch},
                         {"first_step", first.step},
                         {"end_step", first.step + v->steps_},
                         {"ranks", nlohmann::json::array()}};
  if (!spec.dp_weights.empty()) info["dp_weights"] = spec.dp_weights;
  auto& root = v->dirs_[""];
  root.push_back("info.json");
  for (uint64_t r = 0; r < spec.dp; ++r) {
    TP_ASSIGN_OR_RETURN(Slice slice,
                        WeightedRankSlice(spec.global_batch, spec.dp, spec.dp_weights, r));
    RankRecords rr{v->perm_, spec.global_batch, first.batch_in_epoch, v->steps_, slice};
    const std::string dir = RankDir(r);
    root.push_back(dir);
    auto bin = std::make_unique<RecordsFile>(rr, RecordSource(dataset));
    nlohmann::json rank = {
        {"rank", r}, {"slice", {slice.begin, slice.end}}, {"samples", rr.count()}};
    if (dataset->format() == DataFormat::kJsonl) {
      rank["samples.jsonl"] = bin->size();
      v->dirs_[dir] = {"samples.jsonl"};
      v->files_[dir + "/samples.jsonl"] = std::move(bin);
    } else {
      auto idx = std::make_unique<MegatronIdxFile>(bin.get(), dataset->megatron()->dtype());
      rank["samples.bin"] = bin->size();
      rank["samples.idx"] = idx->size();
      v->dirs_[dir] = {"samples.bin", "samples.idx"};
      v->files_[dir + "/samples.bin"] = std::move(bin);
      v->files_[dir + "/samples.idx"] = std::move(idx);
    }
    info["ranks"].push_back(rank);
  }
  v->files_["info.json"] = std::make_unique<StringFile>(info.dump(2) + "\n");
  return std::shared_ptr<const DatasetView>(std::move(v));
}

std::vector<uint64_t> DatasetView::RankSampleIds(uint64_t rank) const {
  std::vector<uint64_t> ids;
  auto slice = WeightedRankSlice(spec_.global_batch, spec_.dp, spec_.dp_weights, rank);
  if (!slice.ok()) return ids;
  RankRecords rr{perm_, spec_.global_batch, first_.batch_in_epoch, steps_, *slice};
  ids.reserve(rr.count());
  for (uint64_t k = 0; k < rr.count(); ++k) ids.push_back(rr.Id(k));
  return ids;
}

const ViewFile* DatasetView::File(std::string_view path) const {
  auto it = files_.find(path);
  return it == files_.end() ? nullptr : it->second.get();
}

bool DatasetView::IsDir(std::string_view path) const { return dirs_.find(path) != dirs_.end(); }

std::vector<std::string> DatasetView::List(std::string_view path) const {
  auto it = dirs_.find(path);
  return it == dirs_.end() ? std::vector<std::string>{} : it->second;
}

}  // namespace tenplex::data
