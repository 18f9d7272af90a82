// The UCX transport (docs/transport.md).
//
// One UCX context and worker per transport, driven by one progress thread that makes
// every UCX call; other threads hand it commands through a queue and wake it with
// ucp_worker_signal. The thread spins briefly when idle, then sleeps on the worker's
// event fd (UCX wakeup): up to 200 ms when nothing is in flight (an idle transport
// costs no CPU), 1 ms otherwise (UCX's wakeup misses some events).
//
// Client side: Fetch splits each ReadRequest into wire requests (a Pending each) of
// at most kMaxRunsPerMessage runs and max_request_bytes, and keeps at most
// max_inflight_bytes of them outstanding per peer (the rest wait). Requests are sent
// eagerly on the peer's endpoint. Data messages are matched to their Pending by request
// id; their stream range maps to destination pieces: eager data is copied out of UCX's
// buffer; a rendezvous message of one piece is received by UCX straight into the
// destination, one of several pieces into a staging buffer that is then scattered. A
// Pending finishes when all its bytes arrived or it failed, and no UCX operation on its
// buffers is in flight.
//
// Server side: a request is answered inside its active-message callback: the region
// is looked up, the runs checked, and all data messages (PlanMessages) posted at once
// on the reply endpoint (UCX queues them). A long run is sent straight from the region;
// short runs are packed into a staging buffer (UCX 1.13 moves iovecs much slower than
// one buffer). The region's hold is released when the last message completes. Posting
// everything in the callback means the reply endpoint, which UCX owns and may destroy
// when the client fails, is never used after the callback returns; the client's window
// bounds what is posted. Staging buffers are pooled while transfers run.
//
// Failure: endpoints use UCX's peer error handling. A broken connection (UCX error
// callback) or a peer that sends nothing for `timeout` while requests are pending is
// failed: its endpoint is force-closed, which completes every UCX operation on it with
// an error, and its Pendings finish with UNAVAILABLE once those completions arrived.
// Callbacks never finish Pendings or close endpoints themselves; they queue the work
// for the progress loop, so nothing is freed under a UCX call that is still running.
//
// Internal to the transport (not a public header). The implementation is split:
//   ucx_transport.cc  lifecycle, the progress loop, UCX operations and their completion
//   ucx_client.cc     Fetch: connecting, sending requests, receiving data and statuses
//   ucx_server.cc     answering requests from a region
#pragma once

#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tenplex/transport/protocol.h"
#include "tenplex/transport/transport.h"

namespace tenplex::transport::ucx {

inline constexpr std::string_view kKind = "ucx";
// Runs of at least this many bytes travel in messages of their own, used in place on
// both sides; shorter ones are packed (PlanMessages).
inline constexpr uint64_t kDirectBytes = 256 << 10;
// Largest packed message; staging buffers have this size.
inline constexpr uint64_t kPackedBytes = 1 << 20;
// Free staging buffers kept for reuse while the transport is busy (released after a
// second without work): the working set of a full window of packed messages.
inline constexpr std::size_t kPooledBuffers = 64;
using Clock = std::chrono::steady_clock;

inline std::string UcsError(ucs_status_t s) { return ucs_status_string(s); }

class UcxTransport;

// One Fetch call, shared by its Pendings (progress thread) and the waiting caller.
struct Call {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int remaining = 0;             // Pendings not finished (progress thread only)
  std::vector<Status> statuses;  // per ReadRequest, first error (progress thread only)
  Status result;                 // set with done
};

struct Peer;

// Client side of one wire request.
struct Pending {
  uint64_t id = 0;
  Call* call = nullptr;
  std::size_t request_index = 0;
  Peer* peer = nullptr;
  std::vector<ReadRun> runs;     // a piece of a ReadRequest (SplitReads)
  std::vector<uint64_t> starts;  // stream positions (protocol.h)
  uint64_t received = 0;         // bytes written into destinations
  bool all_data = false;         // every byte arrived (or an OK status for 0 bytes)
  int inflight = 0;              // UCX operations using this Pending's buffers
  bool queued = false;           // in finish_queue_
  bool sent = false;             // the request left (it counts against the window)
  Status status;
  RequestHeader header{};
  std::string payload;
};

struct Peer {
  PeerId id = 0;
  std::string address;  // the token
  ucp_ep_h ep = nullptr;
  Status failure;  // not ok: failed, no new requests
  bool disconnected = false;
  std::unordered_set<Pending*> pending;  // sent or waiting
  std::deque<Pending*> waiting;          // not sent yet (window full)
  uint64_t inflight_bytes = 0;           // stream bytes of sent, unfinished Pendings
  Clock::time_point last_activity;
};

// Packed bytes of a message made of several pieces.
struct Buffer {
  std::unique_ptr<char[]> data;  // not initialised
  uint64_t size = 0;
};

// A UCX operation in flight; its callback finishes it on the progress thread.
struct Op {
  enum Kind { kSendRequest, kRecvData, kServeData, kServeStatus, kClose };
  Op(Kind k, UcxTransport* s) : kind(k), self(s) {}
  Kind kind;
  UcxTransport* self;
  Pending* pending = nullptr;  // kSendRequest, kRecvData
  uint64_t length = 0;         // kRecvData
  std::vector<ucp_dt_iov_t> iov;
  Buffer staging;                // kRecvData, kServeData of several pieces: the bytes, packed
  bool staged = false;           // kServeData: staging counts in staged_bytes_
  ucp_ep_h served_ep = nullptr;  // kServeData: counts in served_inflight_
  std::shared_ptr<const Region> region;  // kServeData: keeps the region alive
  DataHeader data_header{};
  StatusHeader status_header{};
  std::string text;
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(RegionLookup lookup, const TransportOptions& options)
      : lookup_(std::move(lookup)), options_(options) {}

  ~UcxTransport() override;

  Status Init();

  std::string_view kind() const override { return kKind; }
  std::string LocalAddress() const override { return address_; }
  uint64_t BytesServed() const override { return bytes_served_.load(); }
  uint64_t RequestsRefused() const override { return requests_refused_.load(); }
  uint64_t PeakStagedBytes() const override { return peak_staged_bytes_.load(); }
  uint64_t ProbeRefused(CapabilityRefusal reason) const override {
    return probe_refused_.Get(reason);
  }

  Result<PeerId> Connect(std::string_view address) override;

  void Disconnect(PeerId peer) override;

  Status Fetch(PeerId peer, const std::vector<ReadRequest>& requests) override;

 private:
  // ---- plumbing ----

  using Handler = ucs_status_t (UcxTransport::*)(const void*, size_t, void*, size_t,
                                                 const ucp_am_recv_param_t*);
  template <Handler H>
  static ucs_status_t Trampoline(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
    return (static_cast<UcxTransport*>(arg)->*H)(header, header_length, data, length, param);
  }

  Status SetHandler(AmId id, ucp_am_recv_callback_t cb);

  void Submit(std::function<void()> fn);

  bool RunCommands();

  bool QueueEmpty();

  void Loop();

  void Track(Op* op) { ops_.insert(op); }
  void Untrack(Op* op);

  // A staging buffer of at least n bytes. They are reused (up to kPooledBuffers):
  // fresh memory costs page faults and UCX memory-registration events every time.
  Buffer TakeBuffer(uint64_t n);

  // Posts op's send/receive result: NULL (done now), an error, or a request in flight.
  // Returns false when the operation failed at once.
  bool Posted(Op* op, ucs_status_ptr_t r);

  static void SendCb(void* request, ucs_status_t status, void* user_data);
  static void RecvCb(void* request, ucs_status_t status, size_t, void* user_data);

  ucp_request_param_t SendParams(Op* op);

  void Complete(Op* op, ucs_status_t status);

  // ---- client ----

  // Copies consecutive bytes from src into the pieces.
  static void Scatter(const char* src, const std::vector<ucp_dt_iov_t>& pieces);

  Result<PeerId> DoConnect(const std::string& token, const std::string& bytes);

  static void EpErrorCb(void* arg, ucp_ep_h ep, ucs_status_t status);

  void StartCall(Call* call, PeerId peer_id, const std::vector<ReadRequest>& requests);

  // Sends waiting requests of the peer while their bytes fit the window (one at least).
  void SendWaiting(Peer* peer);

  void FinishCall(Call* call, Status result);

  void FailPending(Pending* p, const Status& s);

  void AddReceived(Pending* p, uint64_t n);

  void QueueFinish(Pending* p);

  void FailPeer(Peer* peer, const Status& s);

  // Work the callbacks queued: endpoint closes, finished Pendings, disconnected peers.
  bool ProcessDeferred();

  void CheckTimeouts(Clock::time_point now);

  // Wakes the callers of Fetches that could not finish before shutdown (a contract
  // violation: the transport is destroyed while they run).
  void AbandonCalls();

  void BeginShutdown();

  // Decodes a reply's header into *h and returns the Pending it is for; null for a
  // header of the wrong size, unknown ids and late messages of a failed or complete
  // request (such messages are dropped).
  template <typename Header>
  Pending* Match(const void* header, size_t header_length, Header* h) {
    if (header_length != sizeof(Header)) return nullptr;
    std::memcpy(h, header, sizeof(Header));
    auto it = pending_.find(h->request_id);
    if (it == pending_.end()) return nullptr;
    Pending* p = it->second.get();
    if (!p->status.ok() || p->all_data) return nullptr;
    return p;
  }

  ucs_status_t OnData(const void* header, size_t header_length, void* data, size_t length,
                      const ucp_am_recv_param_t* param);

  ucs_status_t OnStatus(const void* header, size_t header_length, void* data, size_t length,
                        const ucp_am_recv_param_t* param);

  // ---- server ----

  void SendStatus(ucp_ep_h ep, uint64_t request_id, const Status& s);

  // The serving side's bounds (TransportOptions::max_request_bytes, the connection's
  // answers in flight): a request outside them is refused before any other work.
  Status CheckServeBounds(ucp_ep_h ep, uint64_t total);

  ucs_status_t OnRequest(const void* header, size_t header_length, void* data, size_t length,
                         const ucp_am_recv_param_t* param);

  RegionLookup lookup_;
  TransportOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::string address_;
  std::thread thread_;

  std::mutex queue_mu_;
  std::deque<std::function<void()>> queue_;

  // Progress thread only.
  bool stopping_ = false;
  std::unordered_set<Op*> ops_;
  std::map<PeerId, std::unique_ptr<Peer>> peers_;
  std::unordered_map<ucp_ep_h, PeerId> peer_by_ep_;
  std::unordered_map<std::string, PeerId> peer_by_address_;
  std::unordered_map<uint64_t, std::unique_ptr<Pending>> pending_;
  std::deque<Pending*> finish_queue_;
  std::deque<PeerId> close_queue_;
  std::vector<Buffer> buffers_;  // free staging buffers
  Clock::time_point last_busy_;
  PeerId next_peer_ = 1;
  uint64_t next_request_ = 1;
  std::atomic<uint64_t> bytes_served_{0};  // written by the progress thread
  std::atomic<uint64_t> requests_refused_{0};
  RefusalCounter probe_refused_;  // probe-region reads refused for their capability
  std::atomic<uint64_t> peak_staged_bytes_{0};
  std::unordered_map<ucp_ep_h, uint64_t> served_inflight_;  // answers posted, not complete
  uint64_t staged_bytes_ = 0;                               // staging held by answers in flight
  int disconnected_ = 0;                                    // peers waiting to be erased
};

}  // namespace tenplex::transport::ucx
