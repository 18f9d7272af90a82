#include "tenplex/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <numeric>

#include "tenplex/io/checkpoint.h"
#include "tenplex/model/gpt.h"

namespace tenplex::io {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  std::string d = fs::temp_directory_path() / ("tenplex-io-test-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::string Header(const std::string& json) {
  std::string s(8, '\0');
  uint64_t n = json.size();
  std::memcpy(s.data(), &n, 8);
  return s + json;
}

TEST(SafetensorsTest, RoundTripAndInPlaceWriter) {
  std::string dir = TempDir();
  std::vector<float> a(6);
  std::iota(a.begin(), a.end(), 1.f);
  std::vector<uint16_t> b = {7, 8, 9};
  std::string path = dir + "/x.safetensors";
  ASSERT_TRUE(WriteSafetensors(
                  path, {{"a", DType::kF32, {2, 3}, a.data()}, {"b", DType::kBF16, {3}, b.data()}},
                  {{"k", "v"}})
                  .ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->metadata().at("k"), "v");
  EXPECT_EQ(f->header().data_offset % 8, 0u);
  const SafetensorsEntry* ea = f->Find("a");
  ASSERT_NE(ea, nullptr);
  EXPECT_EQ(ea->shape, (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(f->data(*ea), a.data(), 24), 0);
  EXPECT_EQ(std::memcmp(f->data(*f->Find("b")), b.data(), 6), 0);

  std::string p2 = dir + "/y.safetensors";
  {
    auto w = SafetensorsWriter::Create(
        p2, {{"a", DType::kF32, {2, 3}, 0, 0}, {"b", DType::kBF16, {3}, 0, 0}}, {{"k", "v"}});
    ASSERT_TRUE(w.ok());
    std::memcpy(w->data(0), a.data(), 24);
    std::memcpy(w->data(1), b.data(), 6);
    EXPECT_FALSE(fs::exists(p2));  // nothing visible before commit
    ASSERT_TRUE(w->Commit().ok());
  }
  EXPECT_EQ(*ReadFile(p2), *ReadFile(path));
  {
    auto w = SafetensorsWriter::Create(dir + "/z.safetensors", {{"a", DType::kF32, {2}, 0, 0}});
    ASSERT_TRUE(w.ok());
  }  // abandoned: leaves nothing
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find("z.safetensors"), std::string::npos);
  fs::remove_all(dir);
}

TEST(SafetensorsTest, CorruptHeadersAreClearErrors) {
  struct Case {
    std::string file;
    const char* needle;
  } cases[] = {
      {"abc", "no header length"},
      {Header("{}").substr(0, 6), "no header length"},
      {std::string("\xff\xff\xff\xff\0\0\0\0", 8) + "{}", "100 MiB"},
      {Header("{\"a\"").substr(0, 10) + std::string("\x10\0\0\0\0\0\0\0", 0), "runs past"},
      {Header("[1,2]"), "not a JSON object"},
      {Header("{\"a\": 1}"), "needs dtype"},
      {Header(R"({"a": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}})") + "xxxx", "F99"},
      {Header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})") + "xxxx",
       "needs 8"},
      {Header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}})") + "xxxx",
       "outside"},
      {Header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})") + "xxxx",
       "outside"},
      {Header(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})") + "xxxx",
       "negative"},
      {Header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})") + "xxxx",
       "non-negative"},
      {Header(
           R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, "b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})") +
           "xxxx",
       "overlap"},
      {Header(R"({"__metadata__": {"k": 1}})"), "not a string"},
  };
  // Header length claims more bytes than the file has.
  std::string past(8, '\0');
  past[0] = 50;
  cases[3].file = past + "{}";
  for (const Case& c : cases) {
    auto h = ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(c.file.data()), c.file.size());
    ASSERT_FALSE(h.ok()) << c.needle;
    EXPECT_EQ(h.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(h.status().message().find(c.needle), std::string::npos) << h.status().message();
  }
}

TEST(CheckpointTest, WriterIsAtomicAndOpenValidates) {
  std::string dir = TempDir() + "/ckpt";
  GptArgs a;
  a.num_layers = 2;
  a.hidden_size = 8;
  a.num_attention_heads = 2;
  a.vocab_size = 10;
  a.make_vocab_size_divisible_by = 4;
  a.max_position_embeddings = 4;
  CheckpointInfo info{*MakeGpt(a), *ParseConfig("tp=2"), {{"step", 3}}, {}};
  Layout layout = *MakeLayout(info.model, info.config);
  {
    auto w = CheckpointWriter::Create(dir);
    ASSERT_TRUE(w.ok());
    std::vector<std::vector<uint8_t>> bufs;
    for (const RankLayout& r : layout.ranks) {
      std::vector<TensorData> ts;
      for (const LocalTensor& t : *r.tensors) {
        bufs.emplace_back(t.bytes(), static_cast<uint8_t>(r.rank));
        ts.push_back({t.name, t.dtype, t.shape, bufs.back().data()});
      }
      ASSERT_TRUE(WriteSafetensors(w->RankPath(r.rank), ts).ok());
    }
    EXPECT_FALSE(fs::exists(dir));
    ASSERT_TRUE(w->Commit(info).ok());
  }
  auto back = ReadCheckpointInfo(dir);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->config, info.config);
  EXPECT_EQ(back->extra["step"], 3);
  EXPECT_EQ(back->checksums.size(), 2u);
  ASSERT_TRUE(OpenCheckpoint(dir, layout, *back, true).ok());
  // A layout that does not match, a corrupted file, a missing file.
  Layout other = *MakeLayout(info.model, *ParseConfig("tp=1"));
  EXPECT_NE(OpenCheckpoint(dir, other, *back).status().message().find("but the layout needs"),
            std::string::npos);
  {
    std::string p = dir + "/" + RankFileName(1);
    std::string bytes = *ReadFile(p);
    bytes[bytes.size() - 1] ^= 1;
    ASSERT_TRUE(WriteFileAtomic(p, bytes).ok());
    EXPECT_NE(OpenCheckpoint(dir, layout, *back, true).status().message().find("xxh64"),
              std::string::npos);
    fs::remove(p);
    EXPECT_NE(OpenCheckpoint(dir, layout, *back).status().message().find("lacks rank-00001"),
              std::string::npos);
  }
  EXPECT_EQ(CheckpointWriter::Create(dir).status().code(), StatusCode::kAlreadyExists);
  {
    auto w = CheckpointWriter::Create(dir + "2");
    ASSERT_TRUE(w.ok());
  }  // abandoned
  EXPECT_FALSE(fs::exists(dir + "2"));
  for (const auto& e : fs::directory_iterator(fs::path(dir).parent_path())) {
    EXPECT_EQ(e.path().string().find("partial"), std::string::npos) << e.path();
  }
  fs::remove_all(fs::path(dir).parent_path());
}

}  // namespace
}  // namespace tenplex::io
