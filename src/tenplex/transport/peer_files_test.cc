// Same-host reads of a peer's files: the checks PeerFile::Open makes before it reads
// anything, and ReadPeerFiles against a byte-by-byte reference (AppendBoxReads' runs
// of random boxes, checked with CopyBox, and random runs).
#include "tenplex/transport/peer_files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "tenplex/geometry/copy.h"
#include "tenplex/transport/box_reads.h"

namespace tenplex::transport {
namespace {

namespace fs = std::filesystem;

class PeerFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/tenplex-peer-files-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A file of `n` bytes, byte i = i * 7 + salt (mod 256).
  std::string Write(const std::string& name, uint64_t n, int salt = 3) {
    const std::string path = dir_ + "/" + name;
    std::vector<uint8_t> b(n);
    for (uint64_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(i * 7 + salt);
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), n);
    return path;
  }

  Result<PeerFile> OpenAsNamed(const std::string& path) {
    Result<FileIdentity> id = IdentifyFile(path);
    if (!id.ok()) return id.status();
    return PeerFile::Open(dir_, path, id->bytes, id->dev, id->ino);
  }

  std::string dir_;
};

TEST_F(PeerFilesTest, HostIdentityAndStoreDirectory) {
  EXPECT_EQ(HostBootId().size(), 36u) << HostBootId();  // a UUID
  std::ofstream(dir_ + "/STORE_ID") << "abc\n";
  EXPECT_TRUE(SeesStoreDirectory(dir_, "abc"));
  EXPECT_FALSE(SeesStoreDirectory(dir_, "abd"));
  EXPECT_FALSE(SeesStoreDirectory(dir_, ""));
  EXPECT_FALSE(SeesStoreDirectory(dir_ + "/missing", "abc"));
  EXPECT_FALSE(SeesStoreDirectory("relative/dir", "abc"));
}

TEST_F(PeerFilesTest, OpensOnlyTheFileThePeerNamed) {
  const std::string a = Write("a", 1000);
  const std::string b = Write("b", 1000);
  Result<FileIdentity> ia = IdentifyFile(a);
  ASSERT_TRUE(ia.ok());
  Result<PeerFile> f = PeerFile::Open(dir_, a, 1000, ia->dev, ia->ino);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->size(), 1000u);
  // Another inode under the name (b renamed over a after the peer answered).
  fs::rename(b, a);
  Result<PeerFile> swapped = PeerFile::Open(dir_, a, 1000, ia->dev, ia->ino);
  EXPECT_EQ(swapped.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(swapped.status().message().find("inode"), std::string::npos);
  // The wrong size.
  Result<FileIdentity> ib = IdentifyFile(a);
  ASSERT_TRUE(ib.ok());
  EXPECT_EQ(PeerFile::Open(dir_, a, 999, ib->dev, ib->ino).status().code(),
            StatusCode::kFailedPrecondition);
  // Outside the directory, or through "..".
  EXPECT_EQ(PeerFile::Open(dir_ + "/sub", a, 1000, ib->dev, ib->ino).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(PeerFile::Open(dir_, dir_ + "/../" + fs::path(dir_).filename().string() + "/a", 1000,
                           ib->dev, ib->ino)
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(PeerFile::Open(dir_, dir_ + "//a", 1000, ib->dev, ib->ino).status().code(),
            StatusCode::kFailedPrecondition);
  // A symbolic link to the right file, a FIFO, a directory, a missing file.
  fs::create_symlink(a, dir_ + "/link");
  EXPECT_FALSE(PeerFile::Open(dir_, dir_ + "/link", 1000, ib->dev, ib->ino).ok());
  ASSERT_EQ(::mkfifo((dir_ + "/fifo").c_str(), 0600), 0);
  EXPECT_FALSE(PeerFile::Open(dir_, dir_ + "/fifo", 0, 0, 0).ok());
  fs::create_directory(dir_ + "/d");
  EXPECT_FALSE(PeerFile::Open(dir_, dir_ + "/d", 0, 0, 0).ok());
  EXPECT_EQ(PeerFile::Open(dir_, dir_ + "/missing", 0, 0, 0).status().code(),
            StatusCode::kNotFound);
}

TEST_F(PeerFilesTest, BoxesMatchCopyBox) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 4);
    const int64_t elem = std::vector<int64_t>{1, 2, 4, 8}[rng() % 4];
    Shape shape;
    for (int d = 0; d < rank; ++d) shape.push_back(1 + static_cast<int64_t>(rng() % 40));
    Box box;
    for (int d = 0; d < rank; ++d) {
      const int64_t a = static_cast<int64_t>(rng() % shape[d]);
      const int64_t b = a + 1 + static_cast<int64_t>(rng() % (shape[d] - a));
      box.dims.push_back({a, b});
    }
    const std::string path = Write("t" + std::to_string(trial), Volume(shape) * elem);
    Result<PeerFile> f = OpenAsNamed(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    Shape dshape;
    for (const Interval& i : box.dims) dshape.push_back(i.end - i.begin + 3);
    Box dbox;
    for (const Interval& i : box.dims) dbox.dims.push_back({1, 1 + i.end - i.begin});
    std::vector<uint8_t> got(Volume(dshape) * elem, 0), want(got.size(), 0);
    std::vector<ReadRun> runs;
    ASSERT_TRUE(AppendBoxReads(shape, box, 0, {got.data(), dshape, dbox}, elem, &runs).ok());
    std::vector<uint8_t> src(Volume(shape) * elem);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
    ASSERT_TRUE(
        CopyBox(ConstRegion{src.data(), shape, box}, MutRegion{want.data(), dshape, dbox}, elem)
            .ok());
    ThreadPool pool(3);
    Result<uint64_t> n = ReadPeerFiles({{&*f, &runs}}, &pool, nullptr);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, static_cast<uint64_t>(Volume(box) * elem));
    EXPECT_EQ(got, want) << "trial " << trial;
  }
}

TEST_F(PeerFilesTest, LongRunsAcrossTasksAndManyFiles) {
  const uint64_t big = (9ull << 20) + 123;
  Result<PeerFile> a = OpenAsNamed(Write("a", big));
  Result<PeerFile> b = OpenAsNamed(Write("b", 5000));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<uint8_t> out(big + 5000, 0);
  std::vector<ReadRun> ra{{17, big - 17, out.data()}};
  std::vector<ReadRun> rb;
  for (uint64_t i = 0; i < 5000; i += 10) rb.push_back({i, 10, out.data() + big + i});
  ThreadPool pool(2);
  Result<uint64_t> n = ReadPeerFiles({{&*a, &ra}, {&*b, &rb}}, &pool, nullptr);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, big - 17 + 5000);
  for (uint64_t i = 0; i < big - 17; ++i)
    ASSERT_EQ(out[i], static_cast<uint8_t>((i + 17) * 7 + 3)) << i;
  for (uint64_t i = 0; i < 5000; ++i) ASSERT_EQ(out[big + i], static_cast<uint8_t>(i * 7 + 3)) << i;
}

// Short runs close together are read in spans (one preadv each, the gaps dropped):
// rows of a column slice, runs going backwards, gaps too large to join, more runs than
// a span holds and spans across tasks; every destination byte against the file's
// formula, every byte between destinations untouched. A file that shrank under a span
// is DataLoss.
TEST_F(PeerFilesTest, SpansOfShortRunsAgainstAReference) {
  std::mt19937_64 rng(11);
  const uint64_t size = 32ull << 20;
  Result<PeerFile> f = OpenAsNamed(Write("rows", size));
  ASSERT_TRUE(f.ok());
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<ReadRun> runs;
    std::vector<std::pair<uint64_t, uint64_t>> where;  // file offset, out offset
    std::vector<uint8_t> out(24ull << 20, 0xee);
    uint64_t at = rng() % 4096, out_at = 0;
    const uint64_t len = 1 + rng() % (trial < 6 ? 4096 : 70000);
    while (out_at + len + 8 <= out.size()) {
      // Mostly a fixed stride (a column slice); sometimes a jump back or a big gap.
      uint64_t gap = trial % 3 == 0 ? len : rng() % (3 * len + 1);
      const int kind = static_cast<int>(rng() % 50);
      if (kind == 0) gap = 20000 + rng() % 100000;
      if (at + len > size) break;
      runs.push_back({at, len, out.data() + out_at});
      where.push_back({at, out_at});
      out_at += len + rng() % 3;  // destinations with holes of 0-2 bytes
      at = kind == 1 && at > 50000 ? at - 50000 : at + len + gap;
    }
    ASSERT_GT(runs.size(), 40u);
    ThreadPool pool(3);
    Result<uint64_t> n = ReadPeerFiles({{&*f, &runs}}, trial % 2 ? &pool : nullptr, nullptr);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, len * runs.size());
    std::vector<uint8_t> want(out.size(), 0xee);
    for (const auto& [file_at, to] : where) {
      for (uint64_t i = 0; i < len; ++i) want[to + i] = static_cast<uint8_t>((file_at + i) * 7 + 3);
    }
    ASSERT_EQ(out, want) << "trial " << trial << ", run length " << len;
  }
  // Rows of 100 bytes, 100 apart, over a file cut short after it was opened.
  std::vector<uint8_t> out(1 << 20, 0);
  std::vector<ReadRun> rows;
  for (uint64_t r = 0; r < 4000; ++r) rows.push_back({r * 200, 100, out.data() + r * 100});
  ASSERT_EQ(::truncate(f->name().c_str(), 300000), 0);
  EXPECT_EQ(ReadPeerFiles({{&*f, &rows}}, nullptr, nullptr).status().code(), StatusCode::kDataLoss);
}

// Several files in one read, with empty runs, runs longer than a task (cut into pieces
// of 4 MiB, a span of one each) and short runs between them: every byte lands where the
// reference puts it, with and without the pool.
TEST_F(PeerFilesTest, FilesEmptyRunsAndLongRunsAgainstAReference) {
  const uint64_t size = 24ull << 20;
  Result<PeerFile> a = OpenAsNamed(Write("a", size));
  Result<PeerFile> b = OpenAsNamed(Write("b", size, /*salt=*/100));
  ASSERT_TRUE(a.ok() && b.ok());
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<uint8_t> out(40ull << 20, 0xee), want(out.size(), 0xee);
    std::vector<ReadRun> runs[2];
    uint64_t at[2] = {0, 0}, out_at = 0, bytes = 0;
    for (int i = 0; i < 3000; ++i) {
      const int f = static_cast<int>(rng() % 2);
      const int kind = static_cast<int>(rng() % 100);
      const uint64_t len = kind == 0  ? (9ull << 20) + rng() % 4096
                           : kind < 5 ? 0
                                      : 1 + rng() % 3000;
      if (at[f] + len > size || out_at + len > out.size()) break;
      runs[f].push_back({at[f], len, out.data() + out_at});
      for (uint64_t k = 0; k < len; ++k)
        want[out_at + k] = static_cast<uint8_t>((at[f] + k) * 7 + (f == 0 ? 3 : 100));
      at[f] += len + rng() % (2 * len + 1);
      out_at += len;
      bytes += len;
    }
    ThreadPool pool(3);
    Result<uint64_t> n =
        ReadPeerFiles({{&*a, &runs[0]}, {&*b, &runs[1]}}, trial % 2 ? &pool : nullptr, nullptr);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, bytes);
    ASSERT_EQ(out, want) << "trial " << trial;
  }
}

TEST_F(PeerFilesTest, BadRunsAndCancel) {
  Result<PeerFile> f = OpenAsNamed(Write("a", 100));
  ASSERT_TRUE(f.ok());
  std::vector<uint8_t> out(200, 0xee);
  std::vector<ReadRun> past{{0, 10, out.data()}, {95, 6, out.data() + 10}};
  EXPECT_EQ(ReadPeerFiles({{&*f, &past}}, nullptr, nullptr).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(out[0], 0xee);  // nothing read
  std::vector<ReadRun> huge{{1, ~0ull, out.data()}};
  EXPECT_EQ(ReadPeerFiles({{&*f, &huge}}, nullptr, nullptr).status().code(),
            StatusCode::kOutOfRange);
  std::vector<ReadRun> null_dest{{0, 10, nullptr}};
  EXPECT_EQ(ReadPeerFiles({{&*f, &null_dest}}, nullptr, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<ReadRun> ok{{0, 100, out.data()}};
  std::atomic<bool> cancel{true};
  EXPECT_EQ(ReadPeerFiles({{&*f, &ok}}, nullptr, &cancel).status().code(), StatusCode::kAborted);
  // The file shrank after it was opened (a peer that broke the immutability rule).
  ASSERT_EQ(::truncate(f->name().c_str(), 50), 0);
  cancel = false;
  EXPECT_EQ(ReadPeerFiles({{&*f, &ok}}, nullptr, &cancel).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace tenplex::transport
