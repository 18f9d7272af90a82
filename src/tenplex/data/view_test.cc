#include "tenplex/data/view.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "tenplex/data/test_util.h"
#include "tenplex/util/file.h"

namespace tenplex::data {
namespace {

using testing::TempDir;

std::shared_ptr<const Dataset> MakeJsonl(const std::string& dir, uint64_t n) {
  std::string src;
  for (uint64_t i = 0; i < n; ++i) {
    src += "{\"id\": " + std::to_string(i) + ", \"pad\": \"" + std::string(i % 13, 'x') + "\"}";
    if (i + 1 < n || n % 2 == 0) src += "\n";  // odd n: last line without newline
  }
  EXPECT_TRUE(WriteFileAtomic(dir + "/d.jsonl", src).ok());
  EXPECT_TRUE(BuildIndex(dir + "/d.jsonl", DataFormat::kJsonl, dir + "/idx").ok());
  return *Dataset::Open(dir + "/idx");
}

std::shared_ptr<const Dataset> MakeMegatron(const std::string& dir, uint64_t n) {
  std::vector<std::vector<uint16_t>> seqs(n);
  for (uint64_t i = 0; i < n; ++i) {
    for (uint64_t k = 0; k < (i * 5) % 9; ++k) seqs[i].push_back(static_cast<uint16_t>(i * 16 + k));
  }
  testing::WriteMegatron(dir + "/m", testing::WriteMegatronU16(seqs, {n}));
  EXPECT_TRUE(BuildIndex(dir + "/m", DataFormat::kMegatron, dir + "/idx").ok());
  return *Dataset::Open(dir + "/idx");
}

// Rank r's ids from P to the end of the epoch via GlobalOrder (a path independent of
// the view's record arithmetic).
std::vector<uint64_t> ExpectedIds(const Dataset& d, const ViewSpec& s, uint64_t rank) {
  auto o = GlobalOrder::Create({d.num_samples(), s.seed, s.global_batch});
  StepInfo first = *o->Locate(s.start_sample);
  std::vector<uint64_t> ids;
  for (uint64_t j = first.batch_in_epoch; j < o->batches_per_epoch(); ++j) {
    // The rank's slice, element by element: sample i of a batch belongs to the rank
    // whose prefix of WeightedRankSlice sizes covers it.
    Slice mine{s.global_batch, 0};
    for (uint64_t i = 0; i < s.global_batch; ++i) {
      uint64_t owner = 0, end = 0;
      for (uint64_t r = 0; r < s.dp; ++r) {
        end += WeightedRankSlice(s.global_batch, s.dp, s.dp_weights, r)->size();
        if (i < end) {
          owner = r;
          break;
        }
      }
      if (owner == rank) mine = {std::min(mine.begin, i), i + 1};
    }
    o->AppendBatch(first.step + (j - first.batch_in_epoch), mine, &ids);
  }
  return ids;
}

std::string ExpectedRecords(const Dataset& d, const std::vector<uint64_t>& ids) {
  std::string out;
  for (uint64_t id : ids) {
    out += std::string(*d.Sample(id));
    if (d.format() == DataFormat::kJsonl) out += "\n";
  }
  return out;
}

void CheckRandomReads(const ViewFile& f, const std::string& whole, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 200; ++i) {
    const uint64_t off = rng() % (whole.size() + 5);
    const std::size_t len = rng() % 97;
    std::string buf(len, '?');
    auto n = f.Read(off, len, buf.data());
    ASSERT_TRUE(n.ok());
    const std::string want = off < whole.size() ? whole.substr(off, len) : "";
    ASSERT_EQ(buf.substr(0, *n), want) << "offset " << off << " len " << len;
  }
}

TEST(ViewTest, JsonlRankFilesAreTheRanksRecordsInOrder) {
  std::string dir = TempDir("view-jsonl");
  auto d = MakeJsonl(dir, 61);
  for (ViewSpec s :
       {ViewSpec{3, 10, 3, 0, {}}, ViewSpec{3, 10, 3, 20, {}}, ViewSpec{5, 7, 7, 56, {}},
        ViewSpec{5, 12, 5, 60, {}}, ViewSpec{0, 1, 1, 3, {}}, ViewSpec{3, 10, 3, 20, {2, 1, 1}},
        ViewSpec{5, 12, 4, 60, {1, 5, 2, 3}}}) {
    auto v = DatasetView::Create(d, s);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    std::vector<uint64_t> all;
    for (uint64_t r = 0; r < s.dp; ++r) {
      const std::vector<uint64_t> ids = ExpectedIds(*d, s, r);
      EXPECT_EQ((*v)->RankSampleIds(r), ids);
      const ViewFile* f = (*v)->File(DatasetView::RankDir(r) + "/samples.jsonl");
      ASSERT_NE(f, nullptr);
      const std::string want = ExpectedRecords(*d, ids);
      EXPECT_EQ(f->size(), want.size());
      EXPECT_EQ(*ReadAll(*f), want);
      CheckRandomReads(*f, want, r + 1);
    }
    auto info = nlohmann::json::parse(*ReadAll(*(*v)->File("info.json")));
    EXPECT_EQ(info["dp"], s.dp);
    if (!s.dp_weights.empty()) {
      EXPECT_EQ(info["dp_weights"], s.dp_weights);
    }
    EXPECT_EQ(info["first_step"], s.start_sample / s.global_batch);
    EXPECT_EQ(info["ranks"].size(), s.dp);
  }
}

TEST(ViewTest, DirectoryTable) {
  std::string dir = TempDir("view-dirs");
  auto v = *DatasetView::Create(MakeJsonl(dir, 20), {1, 4, 2, 0, {}});
  EXPECT_TRUE(v->IsDir(""));
  EXPECT_TRUE(v->IsDir("rank-00001"));
  EXPECT_FALSE(v->IsDir("rank-00002"));
  EXPECT_EQ(v->List(""), (std::vector<std::string>{"info.json", "rank-00000", "rank-00001"}));
  EXPECT_EQ(v->List("rank-00000"), (std::vector<std::string>{"samples.jsonl"}));
  EXPECT_EQ(v->File("rank-00000/samples.bin"), nullptr);
  EXPECT_EQ(v->steps(), 5u);
}

TEST(ViewTest, MegatronBinAndIdxDescribeTheRanksSequences) {
  std::string dir = TempDir("view-megatron");
  auto d = MakeMegatron(dir, 40);
  for (ViewSpec s :
       {ViewSpec{8, 6, 4, 0, {}}, ViewSpec{8, 6, 4, 18, {}}, ViewSpec{2, 9, 2, 36, {}}}) {
    auto v = DatasetView::Create(d, s);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    for (uint64_t r = 0; r < s.dp; ++r) {
      const std::vector<uint64_t> ids = ExpectedIds(*d, s, r);
      const std::string rd = DatasetView::RankDir(r);
      const ViewFile* bin = (*v)->File(rd + "/samples.bin");
      const ViewFile* idx = (*v)->File(rd + "/samples.idx");
      ASSERT_NE(bin, nullptr);
      ASSERT_NE(idx, nullptr);
      const std::string want = ExpectedRecords(*d, ids);
      EXPECT_EQ(*ReadAll(*bin), want);
      CheckRandomReads(*bin, want, 7 * r);
      // The generated index is a valid MMIDIDX for the generated data file, listing
      // the rank's sequences in order, one document each.
      const std::string idx_bytes = *ReadAll(*idx);
      CheckRandomReads(*idx, idx_bytes, 9 * r + 1);
      auto l = ParseMegatronIndex(reinterpret_cast<const uint8_t*>(idx_bytes.data()),
                                  idx_bytes.size(), want.size());
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      ASSERT_EQ(l->num_sequences, ids.size());
      EXPECT_EQ(l->num_document_entries, ids.size() + 1);
      EXPECT_EQ(l->dtype.code, 8);
      ASSERT_TRUE(WriteFileAtomic(dir + "/view.idx", idx_bytes).ok());
      ASSERT_TRUE(WriteFileAtomic(dir + "/view.bin", want).ok());
      auto m = MegatronDataset::Open(dir + "/view");
      ASSERT_TRUE(m.ok());
      for (uint64_t k = 0; k < ids.size(); ++k) {
        EXPECT_EQ(m->sequence(k), *d->Sample(ids[k])) << "record " << k;
        EXPECT_EQ(m->document_entry(k), static_cast<int64_t>(k));
      }
    }
  }
}

TEST(ViewTest, BadSpecsAreErrors) {
  std::string dir = TempDir("view-bad");
  auto d = MakeJsonl(dir, 20);
  EXPECT_EQ(DatasetView::Create(d, {0, 4, 2, 5, {}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DatasetView::Create(d, {0, 4, 5, 0, {}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DatasetView::Create(d, {0, 0, 1, 0, {}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DatasetView::Create(d, {0, 21, 1, 0, {}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DatasetView::Create(d, {0, 4, 0, 0, {}}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tenplex::data
