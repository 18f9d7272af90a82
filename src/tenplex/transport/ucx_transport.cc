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
#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "tenplex/transport/protocol.h"
#include "tenplex/transport/transport.h"

namespace tenplex::transport {
namespace {

constexpr std::string_view kKind = "ucx";
// Runs of at least this many bytes travel in messages of their own, used in place on
// both sides; shorter ones are packed (PlanMessages).
constexpr uint64_t kDirectBytes = 256 << 10;
// Largest packed message; staging buffers have this size.
constexpr uint64_t kPackedBytes = 1 << 20;
// Free staging buffers kept for reuse while the transport is busy (released after a
// second without work): the working set of a full window of packed messages.
constexpr std::size_t kPooledBuffers = 64;
using Clock = std::chrono::steady_clock;

std::string UcsError(ucs_status_t s) { return ucs_status_string(s); }

class UcxTransport;

// One Fetch call, shared by its Pendings (progress thread) and the waiting caller.
struct Call {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int remaining = 0;            // Pendings not finished (progress thread only)
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
  Buffer staging;  // kRecvData, kServeData of several pieces: the bytes, packed
  std::shared_ptr<const Region> region;  // kServeData: keeps the region alive
  DataHeader data_header{};
  StatusHeader status_header{};
  std::string text;
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(RegionLookup lookup, const TransportOptions& options)
      : lookup_(std::move(lookup)), options_(options) {}

  ~UcxTransport() override {
    if (thread_.joinable()) {
      Submit([this] { stopping_ = true; });
      thread_.join();
    }
    if (worker_) ucp_worker_destroy(worker_);
    if (context_) ucp_cleanup(context_);
    // Operations UCX never completed (it does not call back after destroy).
    for (Op* op : ops_) delete op;
  }

  Status Init() {
    if (options_.max_message_bytes < kDirectBytes || options_.max_request_bytes == 0 ||
        options_.max_inflight_bytes == 0) {
      return InvalidArgument("UCX transport: max_message_bytes must be at least " +
                             std::to_string(kDirectBytes) + " and the request limits positive");
    }
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return Unavailable("UCX: cannot read configuration: " + UcsError(s));
    if (!options_.ucx_tls.empty()) {
      s = ucp_config_modify(config, "TLS", options_.ucx_tls.c_str());
      if (s != UCS_OK) {
        ucp_config_release(config);
        return InvalidArgument("UCX: bad transport list '" + options_.ucx_tls + "': " +
                               UcsError(s));
      }
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) return Unavailable("UCX: ucp_init failed: " + UcsError(s));

    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    s = ucp_worker_create(context_, &wp, &worker_);
    if (s != UCS_OK) return Unavailable("UCX: cannot create a worker: " + UcsError(s));

    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    s = ucp_worker_query(worker_, &attr);
    if (s != UCS_OK) return Unavailable("UCX: cannot query the worker: " + UcsError(s));
    address_ = EncodeAddress(
        kKind, std::string_view(reinterpret_cast<const char*>(attr.address), attr.address_length));
    ucp_worker_release_address(worker_, attr.address);
    if (attr.max_am_header < sizeof(RequestHeader)) {
      return Unavailable("UCX: active-message headers of " + std::to_string(attr.max_am_header) +
                         " bytes are too small");
    }
    s = ucp_worker_get_efd(worker_, &efd_);
    if (s != UCS_OK) return Unavailable("UCX: no wakeup fd: " + UcsError(s));

    TP_RETURN_IF_ERROR(SetHandler(kFetchRequest, &Trampoline<&UcxTransport::OnRequest>));
    TP_RETURN_IF_ERROR(SetHandler(kFetchData, &Trampoline<&UcxTransport::OnData>));
    TP_RETURN_IF_ERROR(SetHandler(kFetchStatus, &Trampoline<&UcxTransport::OnStatus>));
    thread_ = std::thread([this] { Loop(); });
    return Status::Ok();
  }

  std::string_view kind() const override { return kKind; }
  std::string LocalAddress() const override { return address_; }

  Result<PeerId> Connect(std::string_view address) override {
    TP_ASSIGN_OR_RETURN(std::string bytes, DecodeAddress(kKind, address));
    std::promise<Result<PeerId>> done;
    auto fut = done.get_future();
    Submit([&] { done.set_value(DoConnect(std::string(address), bytes)); });
    return fut.get();
  }

  void Disconnect(PeerId peer) override {
    std::promise<void> done;
    auto fut = done.get_future();
    Submit([&] {
      auto it = peers_.find(peer);
      if (it != peers_.end()) {
        Peer* p = it->second.get();
        if (!p->disconnected) ++disconnected_;
        p->disconnected = true;
        FailPeer(p, Aborted("disconnected from peer " + std::to_string(peer)));
      }
      done.set_value();
    });
    fut.wait();
  }

  Status Fetch(PeerId peer, const std::vector<ReadRequest>& requests) override {
    TP_RETURN_IF_ERROR(CheckReadRequests(requests));
    if (requests.empty()) return Status::Ok();
    Call call;
    call.statuses.resize(requests.size());
    Submit([&] { StartCall(&call, peer, requests); });
    std::unique_lock<std::mutex> l(call.mu);
    call.cv.wait(l, [&] { return call.done; });
    return call.result;
  }

 private:
  // ---- plumbing ----

  using Handler = ucs_status_t (UcxTransport::*)(const void*, size_t, void*, size_t,
                                                 const ucp_am_recv_param_t*);
  template <Handler H>
  static ucs_status_t Trampoline(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
    return (static_cast<UcxTransport*>(arg)->*H)(header, header_length, data, length, param);
  }

  Status SetHandler(AmId id, ucp_am_recv_callback_t cb) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = id;
    hp.cb = cb;
    hp.arg = this;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &hp);
    if (s != UCS_OK) return Unavailable("UCX: cannot set a message handler: " + UcsError(s));
    return Status::Ok();
  }

  void Submit(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> l(queue_mu_);
      queue_.push_back(std::move(fn));
    }
    ucp_worker_signal(worker_);
  }

  bool RunCommands() {
    std::deque<std::function<void()>> q;
    {
      std::lock_guard<std::mutex> l(queue_mu_);
      q.swap(queue_);
    }
    for (auto& fn : q) fn();
    return !q.empty();
  }

  bool QueueEmpty() {
    std::lock_guard<std::mutex> l(queue_mu_);
    return queue_.empty();
  }

  void Loop() {
    int idle = 0;
    Clock::time_point stop_deadline{};
    Clock::time_point next_check = Clock::now();
    for (;;) {
      bool busy = RunCommands();
      unsigned n = 0;
      for (int i = 0; i < 64; ++i) {
        unsigned c = ucp_worker_progress(worker_);
        n += c;
        if (c == 0) break;
      }
      busy |= n > 0;
      busy |= ProcessDeferred();
      const Clock::time_point now = Clock::now();
      if (now >= next_check) {
        CheckTimeouts(now);
        next_check = now + std::chrono::milliseconds(20);
      }
      if (stopping_) {
        if (stop_deadline == Clock::time_point{}) {
          BeginShutdown();
          stop_deadline = now + std::chrono::seconds(2);
        }
        ProcessDeferred();
        if ((pending_.empty() && ops_.empty()) || now > stop_deadline) {
          AbandonCalls();
          break;
        }
      }
      if (busy) {
        idle = 0;
        last_busy_ = now;
        continue;
      }
      if (!buffers_.empty() && ops_.empty() && pending_.empty() &&
          now - last_busy_ > std::chrono::seconds(1)) {
        buffers_.clear();
      }
      if (++idle < 200) continue;
      idle = 0;
      if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
      if (!QueueEmpty()) continue;
      pollfd pfd{efd_, POLLIN, 0};
      // UCX's wakeup misses some events (measured: about one in ten messages over TCP
      // waited for the poll timeout), so with transfers in flight sleep 1 ms at most.
      const bool idle_transport = pending_.empty() && ops_.empty() && !stopping_;
      ::poll(&pfd, 1, idle_transport ? 200 : 1);
    }
  }

  void Track(Op* op) { ops_.insert(op); }
  void Untrack(Op* op) {
    ops_.erase(op);
    if (op->staging.data && buffers_.size() < kPooledBuffers) {
      buffers_.push_back(std::move(op->staging));
    }
    delete op;
  }

  // A staging buffer of at least n bytes. They are reused (up to kPooledBuffers):
  // fresh memory costs page faults and UCX memory-registration events every time.
  Buffer TakeBuffer(uint64_t n) {
    for (std::size_t i = buffers_.size(); i > 0; --i) {
      if (buffers_[i - 1].size >= n) {
        Buffer b = std::move(buffers_[i - 1]);
        buffers_.erase(buffers_.begin() + static_cast<std::ptrdiff_t>(i - 1));
        return b;
      }
    }
    const uint64_t size = std::max(n, kPackedBytes);
    return Buffer{std::unique_ptr<char[]>(new char[size]), size};
  }

  // Posts op's send/receive result: NULL (done now), an error, or a request in flight.
  // Returns false when the operation failed at once.
  bool Posted(Op* op, ucs_status_ptr_t r) {
    if (r == nullptr) {
      Complete(op, UCS_OK);
      return true;
    }
    if (UCS_PTR_IS_ERR(r)) {
      Complete(op, UCS_PTR_STATUS(r));
      return false;
    }
    return true;
  }

  static void SendCb(void* request, ucs_status_t status, void* user_data) {
    Op* op = static_cast<Op*>(user_data);
    ucp_request_free(request);
    op->self->Complete(op, status);
  }
  static void RecvCb(void* request, ucs_status_t status, size_t, void* user_data) {
    Op* op = static_cast<Op*>(user_data);
    ucp_request_free(request);
    op->self->Complete(op, status);
  }

  ucp_request_param_t SendParams(Op* op) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &SendCb;
    p.user_data = op;
    return p;
  }

  void Complete(Op* op, ucs_status_t status) {
    switch (op->kind) {
      case Op::kSendRequest:
      case Op::kRecvData: {
        Pending* p = op->pending;
        --p->inflight;
        if (status == UCS_OK) {
          if (op->kind == Op::kRecvData) {
            if (op->staging.data) Scatter(op->staging.data.get(), op->iov);
            AddReceived(p, op->length);
          }
        } else {
          FailPending(p, Unavailable("transfer from peer " + std::to_string(p->peer->id) +
                                     " failed: " + UcsError(status)));
        }
        QueueFinish(p);
        break;
      }
      case Op::kServeData:
        if (status == UCS_OK) bytes_served_ += op->length;
        break;
      case Op::kServeStatus:
      case Op::kClose:
        break;
    }
    Untrack(op);
  }

  // ---- client ----

  // Copies consecutive bytes from src into the pieces.
  static void Scatter(const char* src, const std::vector<ucp_dt_iov_t>& pieces) {
    for (const ucp_dt_iov_t& piece : pieces) {
      std::memcpy(piece.buffer, src, piece.length);
      src += piece.length;
    }
  }

  Result<PeerId> DoConnect(const std::string& token, const std::string& bytes) {
    auto it = peer_by_address_.find(token);
    if (it != peer_by_address_.end()) {
      Peer* p = peers_.at(it->second).get();
      if (p->failure.ok()) return p->id;
      peer_by_address_.erase(it);
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(bytes.data());
    if (options_.peer_failure_detection) {
      ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &EpErrorCb;
      ep.err_handler.arg = this;
    } else {
      ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    }
    ucp_ep_h h = nullptr;
    ucs_status_t s = ucp_ep_create(worker_, &ep, &h);
    if (s != UCS_OK) return Unavailable("UCX: cannot connect to the peer: " + UcsError(s));
    auto peer = std::make_unique<Peer>();
    peer->id = next_peer_++;
    peer->address = token;
    peer->ep = h;
    peer->last_activity = Clock::now();
    peer_by_ep_[h] = peer->id;
    peer_by_address_[token] = peer->id;
    const PeerId id = peer->id;
    peers_[id] = std::move(peer);
    return id;
  }

  static void EpErrorCb(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<UcxTransport*>(arg);
    auto it = self->peer_by_ep_.find(ep);
    if (it == self->peer_by_ep_.end()) return;
    Peer* p = self->peers_.at(it->second).get();
    self->FailPeer(p, Unavailable("lost the connection to peer " + std::to_string(p->id) + ": " +
                                  UcsError(status)));
  }

  void StartCall(Call* call, PeerId peer_id, const std::vector<ReadRequest>& requests) {
    auto it = peers_.find(peer_id);
    Status bad;
    if (it == peers_.end()) {
      bad = InvalidArgument("unknown peer " + std::to_string(peer_id));
    } else if (!it->second->failure.ok()) {
      bad = it->second->failure;
    } else if (stopping_) {
      bad = Aborted("the transport is shutting down");
    }
    if (!bad.ok()) {
      FinishCall(call, bad);
      return;
    }
    Peer* peer = it->second.get();
    int started = 0;
    for (std::size_t r = 0; r < requests.size(); ++r) {
      const ReadRequest& q = requests[r];
      for (std::vector<ReadRun>& group :
           SplitReads(q.runs, kMaxRunsPerMessage, options_.max_request_bytes)) {
        auto p = std::make_unique<Pending>();
        p->id = next_request_++;
        p->call = call;
        p->request_index = r;
        p->peer = peer;
        p->runs = std::move(group);
        const uint32_t count = static_cast<uint32_t>(p->runs.size());
        p->starts = StreamStarts(p->runs.data(), count);
        p->header = RequestHeader{kProtocolVersion, count, p->id,
                                  static_cast<uint32_t>(q.region.size()), 0};
        p->payload = EncodeRequestPayload(q.region, p->runs.data(), count);
        peer->pending.insert(p.get());
        peer->waiting.push_back(p.get());
        pending_[p->id] = std::move(p);
        ++started;
      }
    }
    call->remaining = started;
    SendWaiting(peer);
  }

  // Sends waiting requests of the peer while their bytes fit the window (one at least).
  void SendWaiting(Peer* peer) {
    while (!peer->waiting.empty() && peer->failure.ok()) {
      Pending* p = peer->waiting.front();
      const uint64_t bytes = p->starts.back();
      if (peer->inflight_bytes > 0 && peer->inflight_bytes + bytes > options_.max_inflight_bytes) {
        break;
      }
      peer->waiting.pop_front();
      if (peer->inflight_bytes == 0) peer->last_activity = Clock::now();
      peer->inflight_bytes += bytes;
      p->sent = true;
      Op* op = new Op(Op::kSendRequest, this);
      op->pending = p;
      Track(op);
      ++p->inflight;
      ucp_request_param_t params = SendParams(op);
      params.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
      params.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
      Posted(op, ucp_am_send_nbx(peer->ep, kFetchRequest, &p->header, sizeof(p->header),
                                 p->payload.data(), p->payload.size(), &params));
      QueueFinish(p);
    }
  }

  void FinishCall(Call* call, Status result) {
    std::lock_guard<std::mutex> l(call->mu);
    call->result = std::move(result);
    call->done = true;
    call->cv.notify_all();
  }

  void FailPending(Pending* p, const Status& s) {
    if (p->status.ok()) p->status = s;
  }

  void AddReceived(Pending* p, uint64_t n) {
    p->received += n;
    p->peer->last_activity = Clock::now();
    if (p->received > p->starts.back()) {
      FailPending(p, DataLoss("peer " + std::to_string(p->peer->id) +
                              " sent more bytes than requested"));
    } else if (p->received == p->starts.back()) {
      p->all_data = true;
    }
  }

  void QueueFinish(Pending* p) {
    if (!p->queued) {
      p->queued = true;
      finish_queue_.push_back(p);
    }
  }

  void FailPeer(Peer* peer, const Status& s) {
    if (peer->failure.ok()) peer->failure = s;
    for (Pending* p : peer->pending) {
      FailPending(p, s);
      QueueFinish(p);
    }
    peer->waiting.clear();
    if (peer->ep != nullptr) close_queue_.push_back(peer->id);
  }

  // Work the callbacks queued: endpoint closes, finished Pendings, disconnected peers.
  bool ProcessDeferred() {
    bool any = false;
    while (!close_queue_.empty()) {
      any = true;
      const PeerId id = close_queue_.front();
      close_queue_.pop_front();
      auto it = peers_.find(id);
      if (it == peers_.end() || it->second->ep == nullptr) continue;
      Peer* peer = it->second.get();
      ucp_ep_h ep = peer->ep;
      peer->ep = nullptr;
      peer_by_ep_.erase(ep);
      Op* op = new Op(Op::kClose, this);
      Track(op);
      ucp_request_param_t params = SendParams(op);
      params.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
      // Force (cancel everything now) needs peer error handling on both sides.
      params.flags = options_.peer_failure_detection ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      Posted(op, ucp_ep_close_nbx(ep, &params));
    }
    while (!finish_queue_.empty()) {
      any = true;
      Pending* p = finish_queue_.front();
      finish_queue_.pop_front();
      p->queued = false;
      if (p->inflight > 0 || (p->status.ok() && !p->all_data)) continue;
      Call* call = p->call;
      if (!p->status.ok() && call->statuses[p->request_index].ok()) {
        call->statuses[p->request_index] = p->status;
      }
      Peer* peer = p->peer;
      peer->pending.erase(p);
      if (p->sent) peer->inflight_bytes -= p->starts.back();
      pending_.erase(p->id);
      SendWaiting(peer);
      if (--call->remaining == 0) {
        Status first;
        for (const Status& s : call->statuses) {
          if (!s.ok()) {
            first = s;
            break;
          }
        }
        FinishCall(call, first);
      }
    }
    if (disconnected_ == 0) return any;
    for (auto it = peers_.begin(); it != peers_.end();) {
      Peer* p = it->second.get();
      if (p->disconnected && p->ep == nullptr && p->pending.empty()) {
        auto a = peer_by_address_.find(p->address);
        if (a != peer_by_address_.end() && a->second == p->id) peer_by_address_.erase(a);
        it = peers_.erase(it);
        --disconnected_;
      } else {
        ++it;
      }
    }
    return any;
  }

  void CheckTimeouts(Clock::time_point now) {
    for (auto& [id, peer] : peers_) {
      if (peer->inflight_bytes == 0 && peer->pending.size() == peer->waiting.size()) continue;
      if (!peer->failure.ok()) continue;
      if (now - peer->last_activity > options_.timeout) {
        FailPeer(peer.get(), Unavailable("peer " + std::to_string(id) + " sent nothing for " +
                                         std::to_string(options_.timeout.count()) + " ms"));
      }
    }
  }

  // Wakes the callers of Fetches that could not finish before shutdown (a contract
  // violation: the transport is destroyed while they run).
  void AbandonCalls() {
    for (auto& [id, p] : pending_) {
      std::lock_guard<std::mutex> l(p->call->mu);
      if (!p->call->done) {
        p->call->result = Aborted("the transport was destroyed during the fetch");
        p->call->done = true;
        p->call->cv.notify_all();
      }
    }
  }

  void BeginShutdown() {
    for (auto& [id, peer] : peers_) {
      FailPeer(peer.get(), Aborted("the transport is shutting down"));
    }
  }

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
                      const ucp_am_recv_param_t* param) {
    DataHeader h;
    Pending* p = Match(header, header_length, &h);
    if (p == nullptr) return UCS_OK;
    const uint64_t total = p->starts.back();
    if (h.version != kProtocolVersion || h.stream_offset > total ||
        length > total - h.stream_offset) {
      FailPending(p, DataLoss("peer " + std::to_string(p->peer->id) +
                              " sent a malformed data message"));
      QueueFinish(p);
      return UCS_OK;
    }
    p->peer->last_activity = Clock::now();
    if (length == 0) return UCS_OK;
    std::vector<ucp_dt_iov_t> pieces;
    ForEachPiece(p->starts, h.stream_offset, h.stream_offset + length,
                 [&](std::size_t i, uint64_t off, uint64_t len) {
                   pieces.push_back({static_cast<char*>(p->runs[i].dest) + off, len});
                 });
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
      Scatter(static_cast<const char*>(data), pieces);
      AddReceived(p, length);
      QueueFinish(p);
      return UCS_OK;
    }
    Op* op = new Op(Op::kRecvData, this);
    op->pending = p;
    op->length = length;
    op->iov = std::move(pieces);
    Track(op);
    ++p->inflight;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                          UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    params.cb.recv_am = &RecvCb;
    params.user_data = op;
    params.memory_type = UCS_MEMORY_TYPE_HOST;
    void* buffer = op->iov[0].buffer;
    if (op->iov.size() > 1) {
      op->staging = TakeBuffer(length);
      buffer = op->staging.data.get();
    }
    Posted(op, ucp_am_recv_data_nbx(worker_, data, buffer, length, &params));
    return UCS_OK;
  }

  ucs_status_t OnStatus(const void* header, size_t header_length, void* data, size_t length,
                        const ucp_am_recv_param_t* param) {
    StatusHeader h;
    Pending* p = Match(header, header_length, &h);
    if (p == nullptr) return UCS_OK;
    std::string_view text;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) && data != nullptr) {
      text = std::string_view(static_cast<const char*>(data), std::min<size_t>(length, 4096));
    }
    Status s = DecodeStatus(h, text);
    p->peer->last_activity = Clock::now();
    if (s.ok()) {
      if (p->starts.back() == 0) {
        p->all_data = true;
      } else {
        FailPending(p, DataLoss("peer " + std::to_string(p->peer->id) +
                                " reported success before sending the data"));
      }
    } else {
      FailPending(p, s);
    }
    QueueFinish(p);
    return UCS_OK;
  }

  // ---- server ----

  void SendStatus(ucp_ep_h ep, uint64_t request_id, const Status& s) {
    Op* op = new Op(Op::kServeStatus, this);
    op->status_header = EncodeStatusHeader(request_id, s);
    op->text = s.message().substr(0, kMaxStatusText);
    Track(op);
    ucp_request_param_t params = SendParams(op);
    params.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_AM_SEND_FLAG_EAGER;
    Posted(op, ucp_am_send_nbx(ep, kFetchStatus, &op->status_header, sizeof(op->status_header),
                               op->text.data(), op->text.size(), &params));
  }

  ucs_status_t OnRequest(const void* header, size_t header_length, void* data, size_t length,
                         const ucp_am_recv_param_t* param) {
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == nullptr) {
      return UCS_OK;  // nobody to answer
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      return UCS_ERR_UNSUPPORTED;  // requests are always eager; fails the sender's send
    }
    ucp_ep_h ep = param->reply_ep;
    uint64_t request_id = 0;
    if (header_length >= sizeof(RequestHeader)) {
      std::memcpy(&request_id, static_cast<const char*>(header) + 8, sizeof(request_id));
    }
    Result<DecodedRequest> req = DecodeRequest(header, header_length, data, length);
    if (!req.ok()) {
      SendStatus(ep, request_id, req.status());
      return UCS_OK;
    }
    Result<Region> region = FindRegion(lookup_, req->region);
    Status s = region.ok() ? CheckRuns(req->region, region->size, req->runs.data(), req->runs.size())
                           : region.status();
    if (!s.ok()) {
      SendStatus(ep, request_id, s);
      return UCS_OK;
    }
    const std::vector<uint64_t> starts = StreamStarts(req->runs.data(), req->runs.size());
    const uint64_t total = starts.back();
    if (total == 0) {
      SendStatus(ep, request_id, Status::Ok());
      return UCS_OK;
    }
    auto shared = std::make_shared<const Region>(std::move(region).value());
    const char* base = static_cast<const char*>(shared->data);
    for (auto [begin, end] : PlanMessages(starts, options_.max_message_bytes, kPackedBytes, kDirectBytes)) {
      Op* op = new Op(Op::kServeData, this);
      op->region = shared;
      op->length = end - begin;
      op->data_header = DataHeader{kProtocolVersion, 0, request_id, begin};
      ForEachPiece(starts, begin, end, [&](std::size_t i, uint64_t off, uint64_t len) {
        op->iov.push_back({const_cast<char*>(base + req->runs[i].offset + off), len});
      });
      const void* buffer = op->iov[0].buffer;
      if (op->iov.size() > 1) {
        op->staging = TakeBuffer(op->length);
        char* at = op->staging.data.get();
        for (const ucp_dt_iov_t& piece : op->iov) {
          std::memcpy(at, piece.buffer, piece.length);
          at += piece.length;
        }
        buffer = op->staging.data.get();
      }
      Track(op);
      ucp_request_param_t params = SendParams(op);
      params.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
      params.memory_type = UCS_MEMORY_TYPE_HOST;
      if (!Posted(op, ucp_am_send_nbx(ep, kFetchData, &op->data_header, sizeof(op->data_header),
                                      buffer, op->length, &params))) {
        break;  // the connection failed; the client sees it too
      }
    }
    return UCS_OK;
  }

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
  uint64_t bytes_served_ = 0;
  int disconnected_ = 0;  // peers waiting to be erased
};

}  // namespace

Result<std::unique_ptr<Transport>> NewUcxTransport(RegionLookup lookup,
                                                   const TransportOptions& options) {
  auto t = std::make_unique<UcxTransport>(std::move(lookup), options);
  TP_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace tenplex::transport
