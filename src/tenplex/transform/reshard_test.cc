// Reshard on real checkpoint directories: synthetic content checked element by element
// after each step, round trips byte-identical, bad inputs rejected with nothing left.
#include "tenplex/transform/reshard.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "tenplex/io/checkpoint.h"
#include "tenplex/model/gpt.h"
#include "tenplex/util/file.h"

namespace tenplex::transform {
namespace {

namespace fs = std::filesystem;

Model Tiny(bool bf16, int64_t hidden = 8) {
  GptArgs a;
  a.num_layers = 4;
  a.hidden_size = hidden;
  a.num_attention_heads = 4;
  a.ffn_hidden_size = 12;
  a.vocab_size = 37;
  a.make_vocab_size_divisible_by = 4;
  a.max_position_embeddings = 6;
  a.swiglu = true;
  a.params_dtype = bf16 ? "bf16" : "fp32";
  return *MakeGpt(a);
}

class ReshardTest : public ::testing::Test {
 public:
  void SetUp() override {
    char tmpl[] = "/tmp/tenplex-reshard-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Nothing but `expected` in the temp directory (no staging leftovers).
  void ExpectOnly(std::set<std::string> expected) const {
    std::set<std::string> got;
    for (const auto& e : fs::directory_iterator(dir_)) got.insert(e.path().filename().string());
    EXPECT_EQ(got, expected);
  }

  Status Run(const std::string& in, const std::string& out, const std::string& to,
             std::optional<Model> model = std::nullopt,
             std::optional<std::string> from = std::nullopt, bool verify = true) {
    ReshardOptions o;
    o.in = Path(in);
    o.out = Path(out);
    o.to = *ParseConfig(to);
    o.model = std::move(model);
    if (from) o.from = *ParseConfig(*from);
    o.verify_checksums = verify;
    o.pool = &pool_;
    return Reshard(o).status();
  }

  std::string dir_;
  ThreadPool pool_{2};
};

std::string Slurp(const std::string& path) { return *ReadFile(path); }

// Writes checkpoint A in config `a`, reshards it through `chain` (every element of each
// step checked against the synthetic content) and back to `a`: byte-identical to A.
void RoundTrip(ReshardTest& t, const Model& m, const char* a, std::vector<const char*> chain,
               uint64_t seed) {
  ASSERT_TRUE(InitCheckpoint(m, *ParseConfig(a), t.Path("A"), seed, &t.pool_).ok());
  std::string prev = "A";
  for (std::size_t i = 0; i < chain.size(); ++i) {
    std::string next = "B" + std::to_string(i);
    Status s = t.Run(prev, next, chain[i], m, std::nullopt);
    ASSERT_TRUE(s.ok()) << chain[i] << ": " << s.ToString();
    Status v = VerifyCheckpoint(t.Path(next), std::nullopt, &t.pool_);
    ASSERT_TRUE(v.ok()) << chain[i] << ": " << v.ToString();
    prev = next;
  }
  ASSERT_TRUE(t.Run(prev, "A2", a).ok());
  for (const auto& e : fs::directory_iterator(t.Path("A"))) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(Slurp(t.Path("A/" + name)), Slurp(t.Path("A2/" + name))) << name;
  }
}

TEST_F(ReshardTest, RoundTripsAreByteIdenticalAndContentIsExact) {
  for (bool bf16 : {false, true}) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    RoundTrip(*this, Tiny(bf16), "tp=2,pp=2,dp=2",
              {"tp=4,pp=1,dp=1,zero=1", "tp=1,pp=3,layers=1+2+1,dp=3,zero=1", "tp=2,pp=4,dp=1"},
              11);
  }
}

TEST_F(ReshardTest, UnevenRoundTripsAreByteIdenticalAndContentIsExact) {
  // Spec §9: uneven -> even -> uneven (tp_weights, dp_weights, zero=1, pp), every element
  // checked against the synthetic full-tensor content, and the round trip byte-identical.
  RoundTrip(*this, Tiny(false), "tp=2,tp_weights=3+1,pp=2,dp=2,dp_weights=2+1",
            {"tp=2,pp=2,dp=2", "tp=3,tp_weights=1+1+1,dp=2,zero=1",
             "tp=4,tp_weights=1+1+1+2,pp=3,layers=2+1+1", "tp=1,dp=3,zero=1"},
            13);
  // A rank that would get no unit is refused, naming the tensor and the rank.
  Status bad = Run("A", "OUT", "tp=4,tp_weights=1+1+1+9");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("tp rank"), std::string::npos) << bad.ToString();
}

TEST_F(ReshardTest, VerifyCatchesWrongContent) {
  Model m = Tiny(false);
  ASSERT_TRUE(InitCheckpoint(m, *ParseConfig("tp=2"), Path("A"), 1, &pool_).ok());
  EXPECT_TRUE(VerifyCheckpoint(Path("A"), 1, &pool_).ok());
  Status s = VerifyCheckpoint(Path("A"), 2, &pool_);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
}

TEST_F(ReshardTest, BadInputsFailAndLeaveNoOutput) {
  Model m = Tiny(false);
  ASSERT_TRUE(InitCheckpoint(m, *ParseConfig("tp=2,pp=2"), Path("A"), 5, &pool_).ok());
  auto expect_error = [&](const std::string& in, const std::string& needle, StatusCode code,
                          std::optional<Model> model = std::nullopt,
                          std::optional<std::string> from = std::nullopt, bool verify = true) {
    Status s = Run(in, "OUT", "tp=4", std::move(model), std::move(from), verify);
    ASSERT_FALSE(s.ok()) << in << " " << needle;
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
    EXPECT_FALSE(fs::exists(Path("OUT")));
  };
  // Model or config other than the checkpoint's.
  expect_error("A", "does not match the checkpoint's model", StatusCode::kInvalidArgument,
               Tiny(false, 16));
  expect_error("A", "does not match the checkpoint's model", StatusCode::kInvalidArgument,
               Tiny(true));
  expect_error("A", "is in config tp=2,pp=2,dp=1, not tp=2,pp=1,dp=1", StatusCode::kInvalidArgument,
               std::nullopt, "tp=2");
  // An impossible target config.
  {
    Status s = Run("A", "OUT", "tp=3");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("target config"), std::string::npos) << s.ToString();
  }
  // A missing rank file.
  fs::copy(Path("A"), Path("missing"));
  fs::remove(Path("missing/rank-00003.safetensors"));
  expect_error("missing", "lacks rank-00003.safetensors", StatusCode::kNotFound);
  // A rank file of another model (wrong shapes) or dtype: the layout check speaks, with
  // or without checksums.
  for (bool bf16 : {false, true}) {
    const std::string other = bf16 ? "other-bf16" : "other-shape";
    ASSERT_TRUE(
        InitCheckpoint(Tiny(bf16, bf16 ? 8 : 16), *ParseConfig("tp=2,pp=2"), Path(other), 5, &pool_)
            .ok());
    const std::string bad = "bad-" + other;
    fs::copy(Path("A"), Path(bad));
    fs::copy_file(Path(other + "/rank-00001.safetensors"), Path(bad + "/rank-00001.safetensors"),
                  fs::copy_options::overwrite_existing);
    expect_error(bad, "but the layout needs", StatusCode::kDataLoss, std::nullopt, std::nullopt,
                 false);
    expect_error(bad, "but the layout needs", StatusCode::kDataLoss);
    fs::remove_all(Path(other));
  }
  // A truncated rank file: the header check names it.
  fs::copy(Path("A"), Path("truncated"));
  const std::string victim = Path("truncated/rank-00002.safetensors");
  fs::resize_file(victim, fs::file_size(victim) - 100);
  expect_error("truncated", "rank-00002.safetensors", StatusCode::kDataLoss, std::nullopt,
               std::nullopt, false);
  expect_error("truncated", "rank-00002.safetensors", StatusCode::kDataLoss);
  // A flipped byte in the data: only the checksum sees it.
  fs::copy(Path("A"), Path("flipped"));
  {
    std::fstream f(Path("flipped/rank-00003.safetensors"),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(-5, std::ios::end);
    f.write(&c, 1);
  }
  expect_error("flipped", "does not match the recorded", StatusCode::kDataLoss);
  // No tenplex.json.
  fs::copy(Path("A"), Path("noinfo"));
  fs::remove(Path("noinfo/tenplex.json"));
  expect_error("noinfo", "tenplex.json is missing", StatusCode::kNotFound);
  // An output that exists and is not empty is never touched.
  fs::create_directories(Path("OUT"));
  std::ofstream(Path("OUT/keep")) << "x";
  Status s = Run("A", "OUT", "tp=4");
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s.ToString();
  EXPECT_TRUE(fs::exists(Path("OUT/keep")));
  fs::remove_all(Path("OUT"));
  ExpectOnly(
      {"A", "missing", "bad-other-shape", "bad-other-bf16", "truncated", "flipped", "noinfo"});
}

// tenplex.json's "checksums" are required (unless verify is off) and type-checked:
// before, a missing, mistyped or partial field meant nothing was checked, and a flipped
// bit went through.
TEST_F(ReshardTest, ChecksumsAreRequiredAndTyped) {
  Model m = Tiny(false);
  ASSERT_TRUE(InitCheckpoint(m, *ParseConfig("tp=2"), Path("A"), 3, &pool_).ok());
  auto info_text = ReadFile(Path("A/tenplex.json"));
  ASSERT_TRUE(info_text.ok());
  const nlohmann::json info = nlohmann::json::parse(*info_text);
  ASSERT_TRUE(info["checksums"].is_object());
  ASSERT_EQ(info["checksums"].size(), 2u);
  // A flipped bit in the data under an intact tenplex.json.
  fs::copy(Path("A"), Path("flip"));
  {
    std::fstream f(Path("flip/rank-00001.safetensors"),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-9, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x01;
    f.seekp(-9, std::ios::end);
    f.write(&c, 1);
  }
  struct Case {
    std::string name;
    std::function<void(nlohmann::json&)> edit;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"missing", [](nlohmann::json& j) { j.erase("checksums"); }, "records no \"checksums\""},
      {"list",
       [](nlohmann::json& j) {
         j["checksums"] = nlohmann::json::array({"0", "1"});
       },
       "\"checksums\" is array"},
      {"one-rank", [](nlohmann::json& j) { j["checksums"].erase("rank-00001.safetensors"); },
       "no checksum for rank-00001.safetensors"},
      {"number", [](nlohmann::json& j) { j["checksums"]["rank-00000.safetensors"] = 12; },
       "checksum of rank-00000.safetensors is 12"},
      {"short", [](nlohmann::json& j) { j["checksums"]["rank-00000.safetensors"] = "abc"; },
       "checksum of rank-00000.safetensors"},
      {"extra",
       [](nlohmann::json& j) { j["checksums"]["rank-00005.safetensors"] = std::string(16, '0'); },
       "rank-00005.safetensors, which is not a rank file"},
  };
  for (const Case& c : cases) {
    fs::copy(Path("A"), Path(c.name));
    nlohmann::json j = info;
    c.edit(j);
    ASSERT_TRUE(WriteFileAtomic(Path(c.name + "/tenplex.json"), j.dump()).ok());
    Status s = Run(c.name, "OUT", "tp=1");
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << c.name << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.ToString();
    EXPECT_FALSE(fs::exists(Path("OUT")));
    s = VerifyCheckpoint(Path(c.name), std::nullopt, &pool_);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << c.name << ": " << s.ToString();
  }
  // Without verification a checkpoint without checksums is read (the explicit way out),
  // but a mistyped field is still an error; the output records checksums again.
  EXPECT_TRUE(Run("missing", "OUT", "tp=1", std::nullopt, std::nullopt, false).ok());
  EXPECT_TRUE(VerifyCheckpoint(Path("OUT"), std::nullopt, &pool_).ok());
  fs::remove_all(Path("OUT"));
  EXPECT_EQ(Run("list", "OUT", "tp=1", std::nullopt, std::nullopt, false).code(),
            StatusCode::kDataLoss);
  Status s = Run("flip", "OUT", "tp=1");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("rank-00001.safetensors: xxh64"), std::string::npos) << s.ToString();
  EXPECT_FALSE(fs::exists(Path("OUT")));
}

// A writer killed mid-write leaves its staging directory; the next writer into the
// same directory removes it when its recorded process is gone, and leaves live ones.
TEST_F(ReshardTest, StaleStagingOfDeadWritersIsRemoved) {
  Model m = Tiny(false);
  ASSERT_TRUE(InitCheckpoint(m, *ParseConfig("tp=2"), Path("A"), 3, &pool_).ok());
  // A pid that is gone.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // The dead writer's staging directory: a real writer's, its record pointing at the
  // dead pid (as if that process had been SIGKILLed mid-write).
  const std::string dead = Path("B.partial-" + std::to_string(child) + "-0");
  {
    auto w = io::CheckpointWriter::Create(Path("B"));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto rec = ReadFile(w->staging_dir() + "/.tenplex-writer");
    ASSERT_TRUE(rec.ok());
    nlohmann::json j = nlohmann::json::parse(*rec);
    ASSERT_EQ(j["pid"].get<long>(), static_cast<long>(::getpid()));
    j["pid"] = child;
    fs::copy(w->staging_dir(), dead);
    ASSERT_TRUE(WriteFileAtomic(dead + "/.tenplex-writer", j.dump()).ok());
    std::ofstream(dead + "/rank-00000.safetensors.tmp.1.0") << "partial";
  }
  ASSERT_TRUE(fs::is_directory(dead));
  // A live writer (this process) and a directory without a writer record stay.
  auto live = io::CheckpointWriter::Create(Path("C"));
  ASSERT_TRUE(live.ok());
  EXPECT_FALSE(fs::exists(dead));
  fs::create_directory(Path("D.partial-1-0"));
  ASSERT_TRUE(Run("A", "OUT", "tp=1").ok());
  EXPECT_TRUE(fs::is_directory(live->staging_dir()));
  EXPECT_TRUE(fs::is_directory(Path("D.partial-1-0")));
  EXPECT_FALSE(fs::exists(Path("OUT/.tenplex-writer")));
}

// The streamed output path (pwrite from warm buffers, streamed_output.h) writes the
// same bytes as the mapped one (ExecutePlan into zero-filled mapped files), tenplex.json
// included, for layouts with padding, ZeRO-1 flat shards, uneven stages and replicas,
// also with chunks that cut elements and runs (100 bytes), more threads than cores, and
// each way of reading the inputs.
TEST_F(ReshardTest, StreamedOutputIsByteIdenticalToMappedOutput) {
  const char* configs[] = {"tp=2,pp=2,dp=2", "tp=4,pp=1,dp=1,zero=1",
                           "tp=1,pp=3,layers=1+2+1,dp=3,zero=1", "tp=2,pp=4,dp=1", "tp=1"};
  int streamed = 0, total = 0;
  for (bool bf16 : {false, true}) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Model m = Tiny(bf16);
    for (int n = 0; n < 5; ++n) {
      const char* from = configs[n];
      const std::string in = "in" + std::to_string(n);
      ASSERT_TRUE(InitCheckpoint(m, *ParseConfig(from), Path(in), 7 + n, &pool_).ok());
      for (int k = 0; k < 5; ++k) {
        const char* to = configs[k];
        if (k == n) continue;
        const std::string base = std::to_string(n) + "-" + std::to_string(k);
        ReshardOptions o;
        o.in = Path(in);
        o.to = *ParseConfig(to);
        o.pool = &pool_;
        o.out = Path("mapped" + base);
        o.streamed = false;
        ASSERT_TRUE(Reshard(o).ok()) << from << " -> " << to;
        o.streamed = true;
        // Input reads: pread of every run straight into the chunk (direct 8), pread of
        // spans into the staging buffer or copies from the mapping (spans over 200
        // bytes), and the defaults.
        const std::pair<std::size_t, std::size_t> variants[] = {
            {100, 8}, {100, 1 << 20}, {std::size_t{4} << 20, 64 << 10}};
        for (auto [chunk, direct] : variants) {
          o.out =
              Path("streamed" + base + "-" + std::to_string(chunk) + "-" + std::to_string(direct));
          o.stream.chunk_bytes = chunk;
          o.stream.direct_run_bytes = direct;
          o.stream.threads = chunk == 100 ? 3 : 0;
          Result<ReshardReport> r = Reshard(o);
          ASSERT_TRUE(r.ok()) << from << " -> " << to << ": " << r.status().ToString();
          streamed += r->streamed;
          ++total;
          std::set<std::string> names;
          for (const auto& e : fs::directory_iterator(Path("mapped" + base))) {
            const std::string name = e.path().filename().string();
            names.insert(name);
            EXPECT_EQ(Slurp(Path("mapped" + base + "/" + name)), Slurp(o.out + "/" + name))
                << from << " -> " << to << ", chunk " << chunk << ": " << name;
          }
          std::set<std::string> got;
          for (const auto& e : fs::directory_iterator(o.out))
            got.insert(e.path().filename().string());
          EXPECT_EQ(got, names);
          Status v = VerifyCheckpoint(o.out, std::nullopt, &pool_);
          EXPECT_TRUE(v.ok()) << from << " -> " << to << ": " << v.ToString();
          fs::remove_all(o.out);
        }
        fs::remove_all(Path("mapped" + base));
      }
    }
  }
  // Plans of one host read only the old layout: every case took the streamed path.
  EXPECT_EQ(streamed, total);
}

}  // namespace
}  // namespace tenplex::transform
