// Coordinator leases over HTTP (lease.h, server_jobs.cc; issue 34 finding 7): the
// /v1/jobs/{job}/lease endpoints, and the fence on every request that changes a job's
// versions: while coordinator A holds the lease, another coordinator's and a holderless
// client's changes get 409 (Aborted) naming A and change nothing; A's go through.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "tenplex/store/client.h"
#include "tenplex/store/server.h"

namespace tenplex::store {
namespace {

using nlohmann::json;

bool Says(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

class ServerLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = std::move(Store::Open({})).value();
    server_ = std::make_unique<Server>(*store_, ServerOptions{});
    Result<int> port = server_->Bind("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    port_ = *port;
    url_ = "http://127.0.0.1:" + std::to_string(port_);
    thread_ = std::thread([this] { EXPECT_TRUE(server_->Serve().ok()); });
  }
  void TearDown() override {
    server_->Stop();
    thread_.join();
  }

  std::unique_ptr<Client> Connect(const std::string& coordinator) {
    ClientOptions o;
    o.coordinator = coordinator;
    Result<std::unique_ptr<Client>> c = Client::Connect(url_, o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  }

  // A raw request with an optional X-Tenplex-Coordinator; the reply (status, body).
  std::pair<int, json> Raw(const std::string& method, const std::string& target,
                           const std::string& coordinator = "") {
    httplib::Client cli("127.0.0.1", port_);
    httplib::Headers h;
    if (!coordinator.empty()) h.emplace(kCoordinatorHeader, coordinator);
    httplib::Result r = method == "GET"    ? cli.Get(target, h)
                        : method == "POST" ? cli.Post(target, h, "", "application/json")
                        : method == "PUT"  ? cli.Put(target, h, "", "application/json")
                                           : cli.Delete(target, h);
    EXPECT_TRUE(r) << method << " " << target;
    if (!r) return {0, json()};
    return {r->status, r->body.empty() ? json() : json::parse(r->body, nullptr, false)};
  }

  std::unique_ptr<Store> store_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::string url_;
};

TEST_F(ServerLeaseTest, LeaseEndpoints) {
  auto [code, body] = Raw("POST", "/v1/jobs/j/lease?ttl_ms=5000");
  EXPECT_EQ(code, 400);
  EXPECT_EQ(body["code"], "INVALID_ARGUMENT");
  EXPECT_NE(body["error"].get<std::string>().find("X-Tenplex-Coordinator"), std::string::npos)
      << body.dump();
  for (const char* bad : {"abc", "5s", "", "99999999999999999999"}) {
    std::tie(code, body) = Raw("POST", std::string("/v1/jobs/j/lease?ttl_ms=") + bad, "A");
    EXPECT_EQ(code, 400) << bad;
    EXPECT_EQ(body["code"], "INVALID_ARGUMENT") << bad;
  }
  for (const std::string& bad :
       {std::string("0"), std::string("-1"), std::to_string(kMaxLeaseMs + 1)}) {
    std::tie(code, body) = Raw("POST", "/v1/jobs/j/lease?ttl_ms=" + bad, "A");
    EXPECT_EQ(code, 400) << bad;
    EXPECT_NE(body["error"].get<std::string>().find("a lease lasts 1 to"), std::string::npos)
        << body.dump();
  }
  std::tie(code, body) = Raw("POST", "/v1/jobs/j/lease?ttl=5000", "A");  // unknown key
  EXPECT_EQ(code, 400);
  std::tie(code, body) = Raw("POST", "/v1/jobs/j/lease", "a b");  // not a holder name
  EXPECT_EQ(code, 400);
  std::tie(code, body) = Raw("GET", "/v1/jobs/j/lease");
  EXPECT_EQ(code, 200);
  EXPECT_TRUE(body["holder"].is_null()) << body.dump();  // all the above took nothing
  EXPECT_EQ(body["remaining_ms"], 0);

  std::tie(code, body) = Raw("POST", "/v1/jobs/j/lease?ttl_ms=60000", "A");
  EXPECT_EQ(code, 200);
  EXPECT_EQ(body, (json{{"job", "j"}, {"holder", "A"}, {"remaining_ms", 60000}}));
  std::tie(code, body) = Raw("GET", "/v1/jobs/j/lease");
  EXPECT_EQ(body["holder"], "A");
  EXPECT_GT(body["remaining_ms"].get<int64_t>(), 50000);
  EXPECT_LE(body["remaining_ms"].get<int64_t>(), 60000);
  std::tie(code, body) = Raw("POST", "/v1/jobs/j/lease", "B");
  EXPECT_EQ(code, 409);
  EXPECT_EQ(body["code"], "ABORTED");
  EXPECT_NE(body["error"].get<std::string>().find("A holds its lease"), std::string::npos)
      << body.dump();
  // DELETE by another holder, or without one, leaves A's lease.
  std::tie(code, body) = Raw("DELETE", "/v1/jobs/j/lease", "B");
  EXPECT_EQ(code, 204);
  std::tie(code, body) = Raw("DELETE", "/v1/jobs/j/lease");
  EXPECT_EQ(code, 400);
  EXPECT_EQ(Raw("GET", "/v1/jobs/j/lease").second["holder"], "A");
  EXPECT_EQ(Raw("PUT", "/v1/jobs/j/lease", "A").first, 405);
  // The client's view, then A's DELETE ends it.
  std::unique_ptr<Client> a = Connect("A");
  Result<LeaseView> l = a->Lease("j");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->holder, "A");
  ASSERT_TRUE(a->ReleaseLease("j").ok());
  l = a->Lease("j");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->holder, "");
  std::unique_ptr<Client> none = Connect("");
  EXPECT_EQ(none->AcquireLease("j").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(none->SetCoordinator("a b").code(), StatusCode::kInvalidArgument);
}

// Every change of a job's version state, as one client sends it.
struct Change {
  std::string name;
  std::function<Status(Client&)> run;
};

std::vector<Change> Changes() {
  return {
      {"begin", [](Client& c) { return c.BeginVersion("j", 5, "{}").status(); }},
      {"info", [](Client& c) { return c.SetVersionInfo("j", 2, R"({"x":1})"); }},
      {"prepare", [](Client& c) { return c.Prepare("j", 2); }},
      {"commit", [](Client& c) { return c.Commit("j", 2, /*keep_old=*/true); }},
      {"abort", [](Client& c) { return c.Abort("j", 2); }},
      {"drop", [](Client& c) { return c.DropVersion("j", 1); }},
      {"release", [](Client& c) { return c.CallJson("POST", "/v1/jobs/j/release").status(); }},
      {"delete", [](Client& c) { return c.DeleteJob("j"); }},
  };
}

TEST_F(ServerLeaseTest, ChangesAreFencedByTheLease) {
  uint8_t x = 1;
  ASSERT_TRUE(store_->BeginVersion("j", 1).ok());
  ASSERT_TRUE(store_->Put("jobs/j/1/rank-00000/x", DType::kU8, {1}, &x, 1).ok());
  ASSERT_TRUE(store_->Commit("j", 1).ok());
  ASSERT_TRUE(store_->BeginVersion("j", 2).ok());
  ASSERT_TRUE(store_->Put("jobs/j/2/rank-00000/x", DType::kU8, {1}, &x, 1).ok());
  std::unique_ptr<Client> a = Connect("coord-A"), b = Connect("coord-B"), none = Connect("");
  ASSERT_TRUE(a->AcquireLease("j", 60000).ok());
  auto unchanged = [&] {
    Result<JobInfo> j = store_->Job("j");
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    EXPECT_EQ(j->current, std::optional<uint64_t>(1));
    ASSERT_EQ(j->versions.size(), 2u);
    EXPECT_FALSE(store_->Version("j", 2)->prepared);
    EXPECT_NE(store_->Version("j", 2)->info, R"({"x":1})");
  };
  for (Client* c : {b.get(), none.get()}) {
    for (const Change& ch : Changes()) {
      Status s = ch.run(*c);
      EXPECT_EQ(s.code(), StatusCode::kAborted) << ch.name << ": " << s.ToString();
      EXPECT_TRUE(Says(s, "coord-A holds its lease here")) << ch.name << ": " << s.ToString();
    }
    unchanged();
  }
  EXPECT_EQ(a->Lease("j")->holder, "coord-A");  // nobody else took it
  // A's changes go through (in an order in which each makes sense).
  ASSERT_TRUE(a->BeginVersion("j", 3, "{}").ok());
  ASSERT_TRUE(a->Abort("j", 3).ok());
  ASSERT_TRUE(a->SetVersionInfo("j", 2, R"({"x":1})").ok());
  ASSERT_TRUE(a->Prepare("j", 2).ok());
  ASSERT_TRUE(a->Commit("j", 2, /*keep_old=*/true).ok());
  ASSERT_TRUE(a->DropVersion("j", 1).ok());
  ASSERT_TRUE(a->BeginVersion("j", 4, "{}").ok());
  ASSERT_TRUE(a->Commit("j", 4, /*keep_old=*/true).ok());
  ASSERT_TRUE(a->CallJson("POST", "/v1/jobs/j/release").ok());
  EXPECT_EQ(store_->Job("j")->versions.size(), 1u);
  EXPECT_EQ(store_->Job("j")->current, std::optional<uint64_t>(4));
  EXPECT_TRUE(b->BeginVersion("j", 5, "{}").status().code() == StatusCode::kAborted);
  // A lets go: B's changes go through, and B's first one takes the lease, so a
  // holderless client is refused naming B until B lets go too.
  ASSERT_TRUE(a->ReleaseLease("j").ok());
  ASSERT_TRUE(b->BeginVersion("j", 5, "{}").ok());
  EXPECT_EQ(b->Lease("j")->holder, "coord-B");
  EXPECT_GT(b->Lease("j")->remaining_ms, kDefaultLeaseMs - 5000);
  EXPECT_EQ(a->Abort("j", 5).code(), StatusCode::kAborted);
  Status s = none->Abort("j", 5);
  EXPECT_TRUE(Says(s, "coord-B holds its lease here")) << s.ToString();
  ASSERT_TRUE(b->Abort("j", 5).ok());
  ASSERT_TRUE(b->ReleaseLease("j").ok());
  ASSERT_TRUE(none->DeleteJob("j").ok());
  EXPECT_EQ(store_->Job("j").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(none->Lease("j")->holder, "");  // a holderless change takes no lease
}

}  // namespace
}  // namespace tenplex::store
