// Same-host reads from a peer daemon (local_peer.h) against a real store server with
// its agent in this process: boxes read through the peer's files equal the tensor's
// bytes; the peer's capability check applies as for a data-plane fetch; a peer that
// dies while its files are read (or before) fails the read with UNAVAILABLE.
#include "tenplex/cluster/local_peer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "tenplex/cluster/agent.h"
#include "tenplex/store/parse.h"
#include "tenplex/store/server.h"
#include "tenplex/transport/capability.h"
#include "tenplex/transport/peer_files.h"

namespace tenplex::cluster {
namespace {

constexpr char kKey[] = "test-key";

class LocalPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = *store::Store::Open({});
    server_ = std::make_unique<store::Server>(*store_, store::ServerOptions{});
    AgentOptions ao;
    ao.transport = "inproc";
    ao.capability_key = kKey;
    agent_ = *Agent::Create(*store_, ao);
    agent_->Install(*server_);
    Result<int> port = server_->Bind("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    peer_ = {"http://127.0.0.1:" + std::to_string(*port), transport::HostBootId(),
             store_->shm_dir(), store_->id()};
    thread_ = std::thread([this] { (void)server_->Serve(); });
  }
  void TearDown() override { Kill(); }
  void Kill() {
    if (!server_) return;
    server_->Stop();
    thread_.join();
    server_.reset();
    agent_.reset();
  }

  // Version 1 of job j with tensor `name` of `bytes` bytes (byte i = i * 13 + 1), committed.
  std::string Commit(uint64_t bytes) {
    EXPECT_TRUE(store_->BeginVersion("j", 1).ok());
    const std::string path = store::TensorPathOf("j", 1, 0, "w");
    std::vector<uint8_t> b(bytes);
    for (uint64_t i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>(i * 13 + 1);
    EXPECT_TRUE(store_->Put(path, DType::kU8, {static_cast<int64_t>(bytes)}, b.data(), bytes).ok());
    EXPECT_TRUE(store_->Commit("j", 1).ok());
    return path;
  }

  LocalReadOptions Options(uint64_t from = 1, uint64_t to = 2) {
    LocalReadOptions o;
    Result<store::JobInfo> j = store_->Job("j");  // the capability names its incarnation
    o.capability = transport::MintCapability(
        kKey, {"j", from, to, transport::UnixSeconds() + 600, j.ok() ? j->incarnation : ""});
    return o;
  }

  std::unique_ptr<store::Store> store_;
  std::unique_ptr<store::Server> server_;
  std::unique_ptr<Agent> agent_;
  std::thread thread_;
  LocalPeer peer_;
};

TEST_F(LocalPeerTest, ReadsRunsThroughTheFiles) {
  const std::string path = Commit(1 << 20);
  ASSERT_TRUE(LocallyReadable(peer_));
  std::mt19937_64 rng(5);
  std::vector<uint8_t> out(1 << 20, 0);
  transport::ReadRequest req{path, {}};
  uint64_t at = 0, want = 0;
  while (at < out.size()) {
    const uint64_t len = std::min<uint64_t>(1 + rng() % 9000, out.size() - at);
    if (rng() % 2) {
      req.runs.push_back({at, len, out.data() + at});
      want += len;
    }
    at += len;
  }
  Result<uint64_t> n = ReadFromLocalPeer(peer_, {req}, Options(), &ThreadPool::Default());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, want);
  for (const transport::ReadRun& r : req.runs) {
    for (uint64_t i = r.offset; i < r.offset + r.length; ++i)
      ASSERT_EQ(out[i], static_cast<uint8_t>(i * 13 + 1)) << i;
  }
}

TEST_F(LocalPeerTest, OnlyWhatTheCapabilityCovers) {
  const std::string path = Commit(4096);
  std::vector<uint8_t> out(4096);
  transport::ReadRequest req{path, {{0, 4096, out.data()}}};
  LocalReadOptions none;
  EXPECT_EQ(ReadFromLocalPeer(peer_, {req}, none, nullptr).status().code(),
            StatusCode::kPermissionDenied);
  LocalReadOptions forged = Options();
  forged.capability = transport::MintCapability("other-key", {"j", 1, 2, 1LL << 40});
  EXPECT_EQ(ReadFromLocalPeer(peer_, {req}, forged, nullptr).status().code(),
            StatusCode::kPermissionDenied);
  // A capability for another version does not cover version 1.
  EXPECT_EQ(ReadFromLocalPeer(peer_, {req}, Options(2, 3), nullptr).status().code(),
            StatusCode::kPermissionDenied);
  // Nor anything of an open version.
  ASSERT_TRUE(store_->BeginVersion("j", 2).ok());
  ASSERT_TRUE(
      store_->Put(store::TensorPathOf("j", 2, 0, "w"), DType::kU8, {16}, out.data(), 16).ok());
  transport::ReadRequest open{store::TensorPathOf("j", 2, 0, "w"), {{0, 16, out.data()}}};
  EXPECT_FALSE(ReadFromLocalPeer(peer_, {open}, Options(2, 3), nullptr).ok());
  // A run past the end.
  transport::ReadRequest past{path, {{4000, 200, out.data()}}};
  EXPECT_EQ(ReadFromLocalPeer(peer_, {past}, Options(), nullptr).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_TRUE(ReadFromLocalPeer(peer_, {req}, Options(), nullptr).ok());
}

// A file named to a same-host peer is never recycled by the page pool (store.h) while
// the agent may still be read through it: the peer's open descriptor would otherwise
// see another tensor's bytes. Without a locate, the same release does recycle the file.
TEST_F(LocalPeerTest, LocatedFilesAreNotRecycledByThePagePool) {
  constexpr uint64_t kBytes = 1 << 20;
  auto release_and_reallocate = [&](uint64_t v) {
    // Version v+1 supersedes v (released: its files go to the pool unless held), then
    // a tensor of the same size in version v+2 takes a pooled file if there is one.
    EXPECT_TRUE(store_->BeginVersion("j", v + 1).ok());
    EXPECT_TRUE(store_->Allocate(store::TensorPathOf("j", v + 1, 0, "x"), DType::kU8, {16}).ok());
    EXPECT_TRUE(store_->Commit("j", v + 1).ok());
    EXPECT_TRUE(store_->BeginVersion("j", v + 2).ok());
    Result<store::TensorWriter> w = store_->Allocate(store::TensorPathOf("j", v + 2, 0, "w"),
                                                     DType::kU8, {static_cast<int64_t>(kBytes)});
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? w->info().file : std::string();
  };
  auto ino = [](const std::string& file) {
    Result<transport::FileIdentity> id = transport::IdentifyFile(file);
    return id.ok() ? id->ino : 0;
  };
  // Control: not located, so the released file is recycled (same inode).
  const std::string path = Commit(kBytes);
  const uint64_t before = ino(store_->Meta(path)->file);
  ASSERT_NE(before, 0u);
  ASSERT_EQ(ino(release_and_reallocate(1)), before);
  ASSERT_TRUE(store_->Commit("j", 3).ok());

  // Located (and read) by a peer: the release leaves it out of the pool.
  const std::string located = store::TensorPathOf("j", 3, 0, "w");
  const std::string file = store_->Meta(located)->file;
  const uint64_t pinned = ino(file);
  std::vector<uint8_t> out(64);
  transport::ReadRequest req{located, {{0, out.size(), out.data()}}};
  ASSERT_TRUE(ReadFromLocalPeer(peer_, {req}, Options(3, 4), nullptr).ok());
  Result<transport::PeerFile> open = transport::PeerFile::Open(
      store_->shm_dir(), file, kBytes, transport::IdentifyFile(file)->dev, pinned);
  ASSERT_TRUE(open.ok()) << open.status().ToString();
  EXPECT_NE(ino(release_and_reallocate(3)), pinned);
  EXPECT_EQ(store_->pool_bytes(), 0u);
}

// Whether this process maps a file of `dir` with inode `ino` (/proc/self/maps; an
// unlinked file keeps its inode there, with " (deleted)" after its last path).
bool MapsInode(const std::string& dir, uint64_t ino) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, path;
    uint64_t inode = 0;
    in >> range >> perms >> offset >> dev >> inode >> path;
    if (inode == ino && path.compare(0, dir.size(), dir) == 0) return true;
  }
  return false;
}

// The map the agent holds of a located file (so that the page pool never recycles it
// under the peer) goes when the store releases the file's version, not at the agent's
// next prepare: until then the released tensor's memory would stay allocated.
TEST_F(LocalPeerTest, LocatedFilesAreUnmappedWhenTheirVersionIsReleased) {
  const std::string path = Commit(1 << 20);
  const std::string file = store_->Meta(path)->file;
  const uint64_t ino = transport::IdentifyFile(file)->ino;
  EXPECT_FALSE(MapsInode(store_->shm_dir(), ino));
  std::vector<uint8_t> out(64);
  transport::ReadRequest req{path, {{0, out.size(), out.data()}}};
  ASSERT_TRUE(ReadFromLocalPeer(peer_, {req}, Options(), nullptr).ok());
  EXPECT_TRUE(MapsInode(store_->shm_dir(), ino));  // pinned by the locate
  ASSERT_TRUE(store_->BeginVersion("j", 2).ok());
  ASSERT_TRUE(store_->Commit("j", 2).ok());  // releases version 1
  // Unmapped on the agent's reaper thread, soon after the release.
  for (int i = 0; i < 500 && MapsInode(store_->shm_dir(), ino); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(MapsInode(store_->shm_dir(), ino));
}

TEST_F(LocalPeerTest, OnlyWhereTheDirectoryIsVisible) {
  EXPECT_TRUE(LocallyReadable(peer_));
  LocalPeer p = peer_;
  p.host_id = "00000000-0000-0000-0000-000000000000";
  EXPECT_FALSE(LocallyReadable(p));  // another machine
  p = peer_;
  p.store_id = "another-store";
  EXPECT_FALSE(LocallyReadable(p));  // another mount namespace sees another directory
  p = peer_;
  p.shm_dir = "/nonexistent/dir";
  EXPECT_FALSE(LocallyReadable(p));
  EXPECT_FALSE(LocallyReadable(LocalPeer{}));
}

TEST_F(LocalPeerTest, APeerThatDiesFailsTheRead) {
  // 2^20 runs of 16 bytes, backwards (so never joined into one read, peer_files.cc):
  // far more than the 50 ms after which the peer dies.
  const uint64_t runs = 1 << 20, len = 16;
  const std::string path = Commit(runs * len);
  std::vector<uint8_t> out(runs * len);
  transport::ReadRequest req{path, {}};
  for (uint64_t i = 0; i < runs; ++i)
    req.runs.push_back({(runs - 1 - i) * len, len, out.data() + i * len});
  std::thread killer([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    Kill();
  });
  const auto t0 = std::chrono::steady_clock::now();
  Result<uint64_t> n = ReadFromLocalPeer(peer_, {req}, Options(), nullptr);
  killer.join();
  EXPECT_EQ(n.status().code(), StatusCode::kUnavailable) << n.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  // And a peer that is gone before the read.
  EXPECT_EQ(ReadFromLocalPeer(peer_, {req}, Options(), nullptr).status().code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tenplex::cluster
