#include "tenplex/data/dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "tenplex/data/test_util.h"
#include "tenplex/util/file.h"

namespace tenplex::data {
namespace {

using testing::MegatronFiles;
using testing::PutLE;
using testing::TempDir;

std::vector<uint16_t> Tokens(uint64_t i) {
  std::vector<uint16_t> t;
  for (uint64_t k = 0; k < (i * 7) % 5; ++k) t.push_back(static_cast<uint16_t>(1000 * i + k));
  return t;  // lengths 0..4, some empty
}

TEST(JsonlTest, IndexAndReadLinesAsTheyWere) {
  std::string dir = TempDir("jsonl");
  std::vector<std::string> lines = {R"({"text": "a"})", R"({"text": "ünïcode ✓"})", "[1, 2, 3]\r",
                                    "42", R"({"nested": {"x": [true, null]}})"};
  std::string src;
  for (auto& l : lines) src += l + "\n";
  src += R"({"last": "no newline"})";
  lines.push_back(R"({"last": "no newline"})");
  ASSERT_TRUE(WriteFileAtomic(dir + "/d.jsonl", src).ok());
  ASSERT_TRUE(BuildIndex(dir + "/d.jsonl", DataFormat::kJsonl, dir + "/idx").ok());
  auto d = Dataset::Open(dir + "/idx");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ((*d)->num_samples(), lines.size());
  for (uint64_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(*(*d)->Sample(i), lines[i]);
    EXPECT_EQ((*d)->SampleBytes(i), lines[i].size());
    EXPECT_EQ(*(*d)->SampleText(i), lines[i]);
  }
  EXPECT_EQ((*d)->Sample(lines.size()).status().code(), StatusCode::kOutOfRange);
  auto meta = nlohmann::json::parse(*ReadFile(dir + "/idx/index.json"));
  EXPECT_EQ(meta["format"], "jsonl");
  EXPECT_EQ(meta["num_samples"], lines.size());
  EXPECT_EQ(meta["source_bytes"], src.size());
}

TEST(JsonlTest, BadSourcesAreClearErrors) {
  std::string dir = TempDir("jsonl-bad");
  auto build = [&](const std::string& text) {
    (void)WriteFileAtomic(dir + "/s.jsonl", text);
    return BuildIndex(dir + "/s.jsonl", DataFormat::kJsonl, dir + "/idx");
  };
  Status s = build("{}\n\n{}\n");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("line 2 is empty"), std::string::npos) << s.message();
  s = build("{}\n{\"a\": }\n");
  EXPECT_NE(s.message().find("line 2 is not valid JSON"), std::string::npos) << s.message();
  EXPECT_FALSE(build("").ok());
  EXPECT_EQ(BuildIndex(dir + "/missing.jsonl", DataFormat::kJsonl, dir + "/idx").code(),
            StatusCode::kNotFound);
  EXPECT_EQ(Dataset::Open(dir + "/nothing").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(ParseDataFormat("csv").ok());
}

class CorruptJsonlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("jsonl-corrupt");
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/s.jsonl", "{\"a\":1}\n{\"b\":22}\n{\"c\":333}\n").ok());
    ASSERT_TRUE(BuildIndex(dir_ + "/s.jsonl", DataFormat::kJsonl, dir_ + "/idx").ok());
    offsets_ = *ReadFile(dir_ + "/idx/offsets.bin");
  }
  Status OpenWith(const std::string& offsets) {
    (void)WriteFileAtomic(dir_ + "/idx/offsets.bin", offsets);
    return Dataset::Open(dir_ + "/idx").status();
  }
  std::string dir_, offsets_;
};

TEST_F(CorruptJsonlTest, OffsetsFileCorruptionIsDataLoss) {
  ASSERT_TRUE(OpenWith(offsets_).ok());
  EXPECT_EQ(OpenWith(offsets_.substr(0, 20)).code(), StatusCode::kDataLoss);
  EXPECT_EQ(OpenWith(offsets_.substr(0, offsets_.size() - 8)).code(), StatusCode::kDataLoss);
  EXPECT_EQ(OpenWith(offsets_ + "x").code(), StatusCode::kDataLoss);
  std::string bad = offsets_;
  bad[0] = 'X';
  EXPECT_EQ(OpenWith(bad).code(), StatusCode::kDataLoss);
  bad = offsets_;
  bad[kJsonlHeaderBytes + 8] = 30;  // off[1] past off[2]
  EXPECT_EQ(OpenWith(bad).code(), StatusCode::kDataLoss);
  bad = offsets_;
  bad[kJsonlHeaderBytes + 8 * 3] = 100;  // off[n] past the source
  EXPECT_EQ(OpenWith(bad).code(), StatusCode::kDataLoss);
  bad = offsets_;
  bad[16] = 7;  // record count
  EXPECT_EQ(OpenWith(bad).code(), StatusCode::kDataLoss);
}

TEST_F(CorruptJsonlTest, ChangedSourceIsDataLoss) {
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/s.jsonl", "{\"a\":1}\n{\"b\":22}\n").ok());
  Status s = Dataset::Open(dir_ + "/idx").status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("rebuild the index"), std::string::npos);
  // Same size, lines moved: caught when reading.
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/s.jsonl", "{\"a\":11}\n{\"b\":2}\n{\"c\":333}\n").ok());
  auto d = Dataset::Open(dir_ + "/idx");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->Sample(0).status().code(), StatusCode::kDataLoss);
  // A broken index.json.
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/idx/index.json", "{\"format\": 3}").ok());
  EXPECT_EQ(Dataset::Open(dir_ + "/idx").status().code(), StatusCode::kDataLoss);
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/idx/index.json", "not json").ok());
  EXPECT_EQ(Dataset::Open(dir_ + "/idx").status().code(), StatusCode::kDataLoss);
}

TEST(MegatronTest, ParsesFilesFromAnIndependentWriter) {
  std::string dir = TempDir("megatron");
  std::vector<std::vector<uint16_t>> seqs;
  for (uint64_t i = 0; i < 23; ++i) seqs.push_back(Tokens(i));
  MegatronFiles f = testing::WriteMegatronU16(seqs, {5, 10, 8});
  testing::WriteMegatron(dir + "/corpus_text_document", f);
  auto m = MegatronDataset::Open(dir + "/corpus_text_document.bin");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->prefix(), dir + "/corpus_text_document");
  EXPECT_EQ(m->num_sequences(), 23u);
  EXPECT_EQ(m->layout().num_document_entries, 4u);
  EXPECT_FALSE(m->layout().has_modes);
  EXPECT_STREQ(m->dtype().name, "uint16");
  EXPECT_EQ(m->document_entry(2), 15);
  for (uint64_t i = 0; i < seqs.size(); ++i) {
    ASSERT_EQ(m->length(i), static_cast<int32_t>(seqs[i].size()));
    std::string_view b = m->sequence(i);
    ASSERT_EQ(b.size(), 2 * seqs[i].size());
    for (uint64_t k = 0; k < seqs[i].size(); ++k) {
      uint16_t t;
      std::memcpy(&t, b.data() + 2 * k, 2);
      EXPECT_EQ(t, seqs[i][k]);
    }
  }
  ASSERT_TRUE(BuildIndex(dir + "/corpus_text_document", DataFormat::kMegatron, dir + "/idx").ok());
  auto d = Dataset::Open(dir + "/idx");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ((*d)->num_samples(), 23u);
  EXPECT_EQ(*(*d)->SampleText(1), "[1000,1001]");
  EXPECT_EQ(*(*d)->SampleText(0), "[]");
  auto meta = nlohmann::json::parse(*ReadFile(dir + "/idx/index.json"));
  EXPECT_EQ(meta["dtype"], "uint16");
  EXPECT_EQ(meta["num_documents"], 3);
  // A multimodal index (a trailing int8 mode per sequence) is accepted.
  f.idx += std::string(seqs.size(), '\1');
  EXPECT_TRUE(
      ParseMegatronIndex(reinterpret_cast<const uint8_t*>(f.idx.data()), f.idx.size(), f.bin.size())
          ->has_modes);
}

Status Parse(const MegatronFiles& f) {
  return ParseMegatronIndex(reinterpret_cast<const uint8_t*>(f.idx.data()), f.idx.size(),
                            f.bin.size())
      .status();
}

TEST(MegatronTest, CorruptIndexesAreDataLoss) {
  const MegatronFiles good = testing::WriteMegatronU16({{1, 2, 3}, {4}, {5, 6}}, {1, 2});
  ASSERT_TRUE(Parse(good).ok());
  auto expect_loss = [&](MegatronFiles f, const std::string& words) {
    Status s = Parse(f);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << words;
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  };
  MegatronFiles f = good;
  f.idx[0] = 'X';
  expect_loss(f, "bad magic");
  f = good;
  f.idx[9] = 2;
  expect_loss(f, "version");
  f = good;
  f.idx[17] = 9;
  expect_loss(f, "dtype code 9");
  f = good;
  f.idx.resize(20);
  expect_loss(f, "header");
  f = good;
  f.idx.resize(f.idx.size() - 1);
  expect_loss(f, "imply");
  f = good;
  f.idx += "xy";
  expect_loss(f, "imply");
  f = good;
  f.idx[18] = 100;  // sequence count
  expect_loss(f, "do not fit");
  f = good;
  f.bin.resize(f.bin.size() - 1);  // last sequence runs past the data
  expect_loss(f, "outside");
  f = good;
  f.idx[34 + 4] = static_cast<char>(0xff);  // length of sequence 1: negative
  f.idx[34 + 7] = static_cast<char>(0xff);
  expect_loss(f, "negative length");
  f = good;
  f.idx[34 + 12 + 8 * 2 + 7] = static_cast<char>(0x80);  // pointer of sequence 2 negative
  expect_loss(f, "outside");
  f = good;
  f.idx[34 + 36 + 8] = 5;  // document index not ending at n / too large
  expect_loss(f, "document index entry");
  f = good;
  f.idx[34 + 36 + 16] = 2;  // last entry 2, not 3
  expect_loss(f, "ends at 2");
  f = good;
  f.idx[34 + 36] = 1;  // first entry not 0
  expect_loss(f, "document index entry 0");
}

TEST(MegatronTest, RandomCorruptionNeverCrashes) {
  // Flip, truncate and extend a valid index at random: parsing must either succeed or
  // fail cleanly with DataLoss (run under ASan/UBSan in CI).
  std::vector<std::vector<uint16_t>> seqs;
  for (uint64_t i = 0; i < 12; ++i) seqs.push_back(Tokens(i));
  const MegatronFiles good = testing::WriteMegatronU16(seqs, {4, 4, 4});
  std::mt19937_64 rng(1);
  int ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    MegatronFiles f = good;
    switch (rng() % 3) {
      case 0:
        for (int k = 0; k < 1 + int(rng() % 3); ++k)
          f.idx[rng() % f.idx.size()] = static_cast<char>(rng());
        break;
      case 1:
        f.idx.resize(rng() % f.idx.size());
        break;
      case 2:
        f.idx.append(rng() % 40, static_cast<char>(rng()));
        break;
    }
    auto l = ParseMegatronIndex(reinterpret_cast<const uint8_t*>(f.idx.data()), f.idx.size(),
                                f.bin.size());
    if (l.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(l.status().code(), StatusCode::kDataLoss);
    }
  }
  EXPECT_GT(ok, 0);  // some flips land in token-irrelevant places (e.g. equal values)
}

}  // namespace
}  // namespace tenplex::data
