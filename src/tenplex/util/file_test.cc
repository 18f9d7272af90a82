#include "tenplex/util/file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <string>

namespace tenplex {
namespace {

namespace fs = std::filesystem;

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tenplex-file-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(FileTest, RegularFilesAreRead) {
  ASSERT_TRUE(WriteFileAtomic(Path("a"), "hello").ok());
  auto text = ReadRegularFile(Path("a"));
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, "hello");
  auto m = MappedFile::OpenRegular(Path("a"));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), m->size()), "hello");
}

// Each of these used to block (a FIFO) or be read through (links); the error names the
// file and says what it is. A FIFO must not block even MappedFile::Open (which follows
// links): the test would hang, and ctest's timeout fail it.
TEST_F(FileTest, OnlyRegularFilesAreOpened) {
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  fs::create_directory(Path("dir"));
  fs::create_symlink("loop", Path("loop"));
  ASSERT_TRUE(WriteFileAtomic(Path("real"), "x").ok());
  fs::create_symlink("real", Path("link"));
  fs::create_symlink("/dev/null", Path("devnull"));
  struct Case {
    std::string name, says;
  };
  for (const Case& c : {Case{"fifo", "a FIFO"}, Case{"dir", "a directory"},
                        Case{"loop", "symbolic link"}, Case{"link", "symbolic link"},
                        Case{"devnull", "symbolic link"}, Case{"missing", "No such file"}}) {
    auto r = ReadRegularFile(Path(c.name));
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_NE(r.status().message().find(Path(c.name)), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().message();
    EXPECT_FALSE(MappedFile::OpenRegular(Path(c.name)).ok()) << c.name;
  }
  // Following links, a FIFO or a device is still refused without blocking; a link to a
  // regular file is fine.
  EXPECT_FALSE(MappedFile::Open(Path("fifo")).ok());
  auto dev = MappedFile::Open("/dev/null");
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.status().message().find("character device"), std::string::npos);
  EXPECT_TRUE(MappedFile::Open(Path("link")).ok());
}

// An atomic write to a FIFO or a device writes into it and leaves it in place: `-o
// /dev/null` as root used to rename a regular file over /dev/null.
TEST_F(FileTest, AtomicWritesToADeviceOrFifoWriteInPlace) {
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  const int rfd = ::open(Path("fifo").c_str(), O_RDONLY | O_NONBLOCK);  // a reader, at once
  ASSERT_GE(rfd, 0);
  EXPECT_TRUE(WriteFileAtomicParts(Path("fifo"), {"ab", "cd"}).ok());
  char buf[16] = {};
  const ssize_t n = ::read(rfd, buf, sizeof(buf));
  ::close(rfd);
  EXPECT_EQ(std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0), "abcd");
  struct stat st {};
  ASSERT_EQ(::stat(Path("fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  // A null device of our own (root only; the test never touches /dev/null itself).
  if (::mknod(Path("null").c_str(), S_IFCHR | 0666, ::makedev(1, 3)) == 0) {
    EXPECT_TRUE(WriteFileAtomic(Path("null"), "x").ok());
    ASSERT_EQ(::stat(Path("null").c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode));
  }
  // A regular file is still replaced atomically.
  ASSERT_TRUE(WriteFileAtomic(Path("real"), "old").ok());
  ASSERT_TRUE(WriteFileAtomic(Path("real"), "new").ok());
  EXPECT_EQ(*ReadFile(Path("real")), "new");
}

// A reservation past what the file system allows is a clean ResourceExhausted naming
// the file (RLIMIT_FSIZE stands in for a full disk here; tests/ckpt_full_disk_test.py
// uses a real tmpfs).
TEST_F(FileTest, ReserveFileSpaceFailsCleanly) {
  int fd = ::open(Path("big").c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(ReserveFileSpace(fd, 1 << 20, "big-file").ok());
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto prev = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 2 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  Status s = ReserveFileSpace(fd, 64 << 20, "big-file");
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, prev);
  ::close(fd);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.message();
  EXPECT_NE(s.message().find("big-file"), std::string::npos) << s.message();
  EXPECT_TRUE(ReserveFileSpace(-1, 0, "nothing").ok());  // nothing to reserve
}

TEST_F(FileTest, ExactIoMovesEveryByteOrNamesTheShortFile) {
  const std::string path = Path("exact");
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  std::string data(300000, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  ASSERT_TRUE(PwriteExact(fd, data.data(), data.size(), 100, "exact").ok());
  std::string back(data.size(), '\0');
  ASSERT_TRUE(PreadExact(fd, back.data(), back.size(), 100, "exact").ok());
  EXPECT_EQ(back, data);
  // One byte past the end: DataLoss naming the file and both offsets.
  Status s = PreadExact(fd, back.data(), back.size(), 101, "exact");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("exact: ended at 300100 bytes, expected 300101"), std::string::npos)
      << s.message();
  ::close(fd);
  // A full device: ResourceExhausted naming it.
  int full = ::open("/dev/full", O_WRONLY);
  if (full >= 0) {
    s = PwriteExact(full, data.data(), 4096, 0, "/dev/full");
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.message();
    EXPECT_NE(s.message().find("/dev/full"), std::string::npos);
    ::close(full);
  }
  // A bad descriptor: the errno, named.
  s = PreadExact(-1, back.data(), 1, 0, "nothing");
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.message();
  EXPECT_NE(s.message().find("read nothing"), std::string::npos);
}

}  // namespace
}  // namespace tenplex
