// The HTTP server and the C++ client in one process: every client call against a
// real server on a loopback port, checked against the Store underneath.
#include "tenplex/store/server.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tenplex/geometry/copy.h"
#include "tenplex/store/client.h"
#include "tenplex/store/mapping.h"
#include "tenplex/util/hash.h"

namespace tenplex::store {
namespace {

struct Running {
  std::unique_ptr<Store> store;
  std::unique_ptr<Server> server;
  std::thread thread;
  std::string url;

  explicit Running(ServerOptions o = {}, StoreOptions so = {}) {
    store = std::move(Store::Open(so)).value();
    server = std::make_unique<Server>(*store, o);
    auto port = server->Bind("127.0.0.1", 0);
    EXPECT_TRUE(port.ok()) << port.status().ToString();
    url = "http://127.0.0.1:" + std::to_string(*port);
    thread = std::thread([this] { EXPECT_TRUE(server->Serve().ok()); });
  }
  ~Running() {
    server->Stop();
    thread.join();
  }
};

std::vector<uint8_t> RandomBytes(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::unique_ptr<Client> Connect(const std::string& url, ClientOptions o = {}) {
  auto c = Client::Connect(url, o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

TEST(ServerTest, LocalAndHttpPathsAgree) {
  Running r;
  auto local = Connect(r.url);
  auto remote = Connect(r.url, {.token = "", .use_shm = false});
  EXPECT_TRUE(local->local());
  EXPECT_FALSE(remote->local());
  EXPECT_EQ(local->store_id(), r.store->id());
  // Issue 34 finding 3: /v1/health serves the stable host id; clients read it.
  EXPECT_EQ(local->host_id(), r.store->host_id());
  EXPECT_EQ(remote->host_id(), r.store->host_id());
  EXPECT_FALSE(r.store->host_id().empty());

  auto v = local->BeginVersion("j", std::nullopt, R"({"a": 1})");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const Shape shape{6, 10};
  auto a = RandomBytes(6 * 10 * 4, 1), b = RandomBytes(6 * 10 * 4, 2);
  ASSERT_TRUE(local->Write("jobs/j/1/rank-00000/a", DType::kF32, shape, a.data(), a.size()).ok());
  ASSERT_TRUE(remote->Write("jobs/j/1/rank-00001/b", DType::kF32, shape, b.data(), b.size()).ok());
  // Both arrived in the store.
  auto ra = r.store->Get("jobs/j/1/rank-00000/a");
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(std::memcmp(ra->data(), a.data(), a.size()), 0);
  auto rb = r.store->Get("jobs/j/1/rank-00001/b");
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(std::memcmp(rb->data(), b.data(), b.size()), 0);

  // Reads through both paths, and a strided range against the strided copy.
  for (Client* c : {local.get(), remote.get()}) {
    auto list = c->List("jobs/j/1/");
    ASSERT_TRUE(list.ok());
    ASSERT_EQ(list->size(), 2u);
    EXPECT_EQ((*list)[0].file.empty(), !c->local());
    std::vector<uint8_t> got(a.size());
    ASSERT_TRUE(c->Read((*list)[0], got.data()).ok());
    EXPECT_EQ(got, a);
    DType dt;
    Shape sh;
    auto part = c->Get("jobs/j/1/rank-00001/b", "1:4,2:7", &dt, &sh);
    ASSERT_TRUE(part.ok()) << part.status().ToString();
    EXPECT_EQ(dt, DType::kF32);
    EXPECT_EQ(sh, (Shape{3, 5}));
    std::vector<uint8_t> want(3 * 5 * 4);
    ASSERT_TRUE(CopyBox(ConstRegion{b.data(), shape, Box({{1, 4}, {2, 7}})},
                        MutRegion{want.data(), Shape{3, 5}, BoxOf(Shape{3, 5})}, 4)
                    .ok());
    EXPECT_EQ(std::vector<uint8_t>(part->begin(), part->end()), want);
    std::vector<uint8_t> into(want.size());
    ASSERT_TRUE(c->GetInto("jobs/j/1/rank-00001/b", "1:4,2:7", into.data(), into.size()).ok());
    EXPECT_EQ(into, want);
    EXPECT_EQ(c->GetInto("jobs/j/1/rank-00001/b", "1:4", into.data(), into.size()).code(),
              StatusCode::kDataLoss);
    auto meta = c->Meta("jobs/j/1/rank-00000/a");
    ASSERT_TRUE(meta.ok());
    EXPECT_EQ(meta->second, Xxh64Hex(a.data(), a.size()));
  }

  // Zero-copy: allocate, map writable, write in place; the store sees the bytes.
  auto infos = local->Allocate({{"jobs/j/1/rank-00002/z", DType::kI32, {100}}});
  ASSERT_TRUE(infos.ok()) << infos.status().ToString();
  {
    auto m = Client::Map((*infos)[0], /*writable=*/true);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    for (int i = 0; i < 100; ++i) std::memcpy(m->data() + 4 * i, &i, 4);
  }
  auto z = r.store->Get("jobs/j/1/rank-00002/z");
  ASSERT_TRUE(z.ok());
  int v37 = 0;
  std::memcpy(&v37, z->data() + 4 * 37, 4);
  EXPECT_EQ(v37, 37);
  EXPECT_EQ(remote->Allocate({{"jobs/j/1/rank-00002/y", DType::kI32, {1}}}).status().code(),
            StatusCode::kFailedPrecondition);

  // Errors come back with their codes.
  EXPECT_EQ(local->Get("jobs/j/1/rank-00000/nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(local->Get("jobs/j/1/rank-00000/a", "0:7").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(local->Get("jobs/j/1/rank-00000/a", "x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(local->Put("jobs/j/1/rank-00000/a", DType::kF32, shape, a.data(), 3).status().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(local->Commit("j", 1).ok());
  EXPECT_EQ(
      local->Put("jobs/j/1/rank-00000/a", DType::kF32, shape, a.data(), a.size()).status().code(),
      StatusCode::kFailedPrecondition);
  EXPECT_EQ(Client::Map((*infos)[0], true).status().code(),
            StatusCode::kOk);  // info is stale: still open there
  auto shm = local->ShmInfo("jobs/j/current/rank-00002/z");
  ASSERT_TRUE(shm.ok());
  EXPECT_TRUE(shm->committed);
  EXPECT_EQ(Client::Map(*shm, true).status().code(), StatusCode::kFailedPrecondition);
  auto vi = remote->Version("j", std::nullopt);
  ASSERT_TRUE(vi.ok());
  EXPECT_EQ(vi->version, 1u);
  EXPECT_EQ(vi->info, R"({"a":1})");
  EXPECT_EQ(remote->Abort("j", 1).code(), StatusCode::kFailedPrecondition);
}

// A tensor of an open version linked from a committed one (unchanged by a transform)
// shares the committed file: /v1/shm reports it read-only and no map writes it, so the
// committed bytes and their checksum cannot change.
TEST(ServerTest, LinkedTensorsAreReadOnly) {
  Running r;
  const std::vector<uint8_t> bytes = RandomBytes(8192, 5);
  ASSERT_TRUE(r.store->BeginVersion("j", 1).ok());
  ASSERT_TRUE(
      r.store->Put("jobs/j/1/rank-00000/w", DType::kU8, Shape{8192}, bytes.data(), bytes.size())
          .ok());
  ASSERT_TRUE(r.store->Commit("j", 1).ok());
  const std::string sum = *r.store->Checksum("jobs/j/1/rank-00000/w");
  EXPECT_EQ(sum, Xxh64Hex(bytes.data(), bytes.size()));
  ASSERT_TRUE(r.store->BeginVersion("j", 2).ok());
  ASSERT_TRUE(r.store->Link("jobs/j/1/rank-00000/w", "jobs/j/2/rank-00000/w").ok());
  ASSERT_TRUE(r.store->Allocate("jobs/j/2/rank-00000/fresh", DType::kU8, Shape{16}).ok());
  auto c = Connect(r.url);
  auto shm = [&](const std::string& path) {
    Result<std::string> text = c->CallJson("GET", "/v1/shm/" + path);
    EXPECT_TRUE(text.ok()) << text.status().ToString();
    return nlohmann::json::parse(text.ok() ? *text : "{}");
  };
  EXPECT_EQ(shm("jobs/j/2/rank-00000/w")["writable"], false);
  EXPECT_EQ(shm("jobs/j/2/rank-00000/w")["linked"], true);
  EXPECT_EQ(shm("jobs/j/2/rank-00000/fresh")["writable"], true);
  Result<TensorInfo> linked = c->ShmInfo("jobs/j/2/rank-00000/w");
  ASSERT_TRUE(linked.ok());
  Result<ShmMapping> m = Client::Map(*linked, /*writable=*/true);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition) << m.status().ToString();
  EXPECT_TRUE(Client::Map(*linked, /*writable=*/false).ok());
  Result<TensorInfo> fresh = c->ShmInfo("jobs/j/2/rank-00000/fresh");
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(Client::Map(*fresh, /*writable=*/true).ok());
  // Committed v1 and its checksum are as they were.
  TensorRef v1 = *r.store->Get("jobs/j/1/rank-00000/w");
  EXPECT_EQ(std::memcmp(v1.data(), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(*r.store->Checksum("jobs/j/1/rank-00000/w"), sum);
}

TEST(ServerTest, TokenAndUnreachable) {
  Running r({.token = "t0k"});
  EXPECT_EQ(Client::Connect(r.url).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(Client::Connect(r.url, {.token = "bad"}).status().code(), StatusCode::kUnauthenticated);
  auto c = Client::Connect(r.url, {.token = "t0k"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE((*c)->BeginVersion("j").ok());
  Server s(*r.store, {});
  EXPECT_EQ(s.Bind("0.0.0.0", 0).status().code(), StatusCode::kInvalidArgument);  // no token
  EXPECT_EQ(Client::Connect("http://127.0.0.1:1").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(Client::Connect("https://127.0.0.1:1").status().code(), StatusCode::kUnimplemented);
}

// Issue 34 finding 2: cpp-httplib's default socket options set SO_REUSEPORT, so a second
// server bound a port in use and the kernel split the requests between two stores.
// SO_REUSEADDR stays: a restart binds while the old server's closed connections sit in
// TIME_WAIT.
TEST(ServerTest, PortInUseIsRefusedAndRestartBinds) {
  int port = 0;
  std::unique_ptr<Client> client;  // outlives the server: the server closes first
  {
    Running r;
    port = std::stoi(r.url.substr(r.url.rfind(':') + 1));
    Server second(*r.store, {});
    auto b = second.Bind("127.0.0.1", port);
    ASSERT_FALSE(b.ok()) << "a second server bound port " << port;
    EXPECT_EQ(b.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(b.status().message().find("port " + std::to_string(port) + " is in use"),
              std::string::npos)
        << b.status().message();
    client = Connect(r.url, {.token = "", .use_shm = false});
    ASSERT_TRUE(client->Jobs().ok());
  }
  auto store = std::move(Store::Open()).value();
  Server again(*store, {});
  auto b = again.Bind("127.0.0.1", port);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
}

TEST(ServerTest, StopBeforeServeIsNotLost) {
  auto store = std::move(Store::Open()).value();
  Server s(*store, {});
  ASSERT_TRUE(s.Bind("127.0.0.1", 0).ok());
  s.Stop();
  EXPECT_TRUE(s.Serve().ok());  // returns at once
}

TEST(ServerTest, StatusCodesMapBothWays) {
  for (int c = 1; c <= static_cast<int>(StatusCode::kUnimplemented); ++c) {
    StatusCode code = static_cast<StatusCode>(c);
    int http = HttpStatusFor(code);
    EXPECT_GE(http, 400);
    EXPECT_EQ(StatusCodeFromName(StatusCodeName(code), http), code);
  }
}

}  // namespace
}  // namespace tenplex::store
