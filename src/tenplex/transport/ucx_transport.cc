// The UCX transport: lifecycle, the progress loop, UCX operations (ucx_internal.h).
#include <cstdlib>

#include "tenplex/transport/ucx_internal.h"
#include "tenplex/transport/ucx_version.h"

namespace tenplex::transport::ucx {

std::string UcxRelease::ToString() const {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

bool UcxRelease::AtLeast(const UcxRelease& other) const {
  if (major != other.major) return major > other.major;
  if (minor != other.minor) return minor > other.minor;
  return release >= other.release;
}

UcxRelease UcxLibraryRelease() {
  UcxRelease r;
  ucp_get_version(&r.major, &r.minor, &r.release);
  return r;
}

UcxRelease UcxHeaderRelease() { return UcxRelease{UCP_API_MAJOR, UCP_API_MINOR, 0}; }

Status CheckUcxLibrary(const UcxRelease& library, const UcxRelease& headers) {
  if (library.major == headers.major && library.minor >= headers.minor) return Status::Ok();
  return FailedPrecondition("UCX: the loaded library is release " + library.ToString() +
                            ", built against the headers of " + std::to_string(headers.major) +
                            "." + std::to_string(headers.minor) +
                            ": another libucp.so.0 is ahead in the loader's path "
                            "(LD_LIBRARY_PATH?); tenplex runs with the UCX it was built with "
                            "(cmake/ucx.cmake)");
}

std::vector<UcxSetting> UcxSettings(const std::string& tls, const std::string& net_devices,
                                    const std::function<const char*(const char*)>& env) {
  std::vector<UcxSetting> out;
  if (!tls.empty()) out.push_back({"TLS", tls});
  if (!net_devices.empty()) out.push_back({"NET_DEVICES", net_devices});
  for (const char* key : {"TCP_TX_SEG_SIZE", "TCP_RX_SEG_SIZE"}) {
    if (env((std::string("UCX_") + key).c_str()) == nullptr)
      out.push_back({key, kUcxTcpSegmentSize});
  }
  return out;
}

namespace {

// The UCX configuration: the environment's, with UcxSettings applied. The caller releases it.
Result<ucp_config_t*> ReadConfig(const TransportOptions& options) {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return Unavailable("UCX: cannot read configuration: " + UcsError(s));
  for (const UcxSetting& u : UcxSettings(options.ucx_tls, options.ucx_net_devices,
                                         [](const char* k) { return std::getenv(k); })) {
    s = ucp_config_modify(config, u.key.c_str(), u.value.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      const std::string what = u.key == "TLS"           ? "transport list"
                               : u.key == "NET_DEVICES" ? "device list"
                                                        : u.key;
      return InvalidArgument("UCX: bad " + what + " '" + u.value + "': " + UcsError(s));
    }
  }
  return config;
}

}  // namespace

UcxTransport::~UcxTransport() {
  if (thread_.joinable()) {
    Submit([this] { stopping_ = true; });
    thread_.join();
  }
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
  // Operations UCX never completed (it does not call back after destroy).
  for (Op* op : ops_) delete op;
}

Status UcxTransport::Init() {
  if (options_.max_message_bytes < kDirectBytes || options_.max_request_bytes == 0 ||
      options_.max_inflight_bytes == 0) {
    return InvalidArgument("UCX transport: max_message_bytes must be at least " +
                           std::to_string(kDirectBytes) + " and the request limits positive");
  }
  TP_RETURN_IF_ERROR(CheckUcxLibrary(UcxLibraryRelease(), UcxHeaderRelease()));
  TP_ASSIGN_OR_RETURN(ucp_config_t * config, ReadConfig(options_));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucs_status_t s = ucp_init(&params, config, &context_);
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

Result<PeerId> UcxTransport::Connect(std::string_view address) {
  TP_ASSIGN_OR_RETURN(std::string bytes, DecodeAddress(kKind, address));
  std::promise<Result<PeerId>> done;
  auto fut = done.get_future();
  Submit([&] { done.set_value(DoConnect(std::string(address), bytes)); });
  return fut.get();
}

void UcxTransport::Disconnect(PeerId peer) {
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

Status UcxTransport::Fetch(PeerId peer, const std::vector<ReadRequest>& requests) {
  TP_RETURN_IF_ERROR(CheckReadRequests(requests));
  if (requests.empty()) return Status::Ok();
  Call call;
  call.statuses.resize(requests.size());
  Submit([&] { StartCall(&call, peer, requests); });
  std::unique_lock<std::mutex> l(call.mu);
  call.cv.wait(l, [&] { return call.done; });
  return call.result;
}

Status UcxTransport::SetHandler(AmId id, ucp_am_recv_callback_t cb) {
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

void UcxTransport::Submit(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> l(queue_mu_);
    queue_.push_back(std::move(fn));
  }
  ucp_worker_signal(worker_);
}

bool UcxTransport::RunCommands() {
  std::deque<std::function<void()>> q;
  {
    std::lock_guard<std::mutex> l(queue_mu_);
    q.swap(queue_);
  }
  for (auto& fn : q) fn();
  return !q.empty();
}

bool UcxTransport::QueueEmpty() {
  std::lock_guard<std::mutex> l(queue_mu_);
  return queue_.empty();
}

void UcxTransport::Loop() {
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

void UcxTransport::Untrack(Op* op) {
  ops_.erase(op);
  if (op->staging.data && buffers_.size() < kPooledBuffers) {
    buffers_.push_back(std::move(op->staging));
  }
  delete op;
}

Buffer UcxTransport::TakeBuffer(uint64_t n) {
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

bool UcxTransport::Posted(Op* op, ucs_status_ptr_t r) {
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

void UcxTransport::SendCb(void* request, ucs_status_t status, void* user_data) {
  Op* op = static_cast<Op*>(user_data);
  ucp_request_free(request);
  op->self->Complete(op, status);
}

void UcxTransport::RecvCb(void* request, ucs_status_t status, size_t, void* user_data) {
  Op* op = static_cast<Op*>(user_data);
  ucp_request_free(request);
  op->self->Complete(op, status);
}

ucp_request_param_t UcxTransport::SendParams(Op* op) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &SendCb;
  p.user_data = op;
  return p;
}

void UcxTransport::Complete(Op* op, ucs_status_t status) {
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
    case Op::kServeData: {
      if (status == UCS_OK) bytes_served_ += op->length;
      if (op->staged) staged_bytes_ -= op->staging.size;
      auto it = served_inflight_.find(op->served_ep);
      if (it != served_inflight_.end() && (it->second -= op->length) == 0) {
        served_inflight_.erase(it);
      }
      break;
    }
    case Op::kServeStatus:
    case Op::kClose:
      break;
  }
  Untrack(op);
}

}  // namespace tenplex::transport::ucx

namespace tenplex::transport {

Result<std::unique_ptr<Transport>> NewUcxTransport(RegionLookup lookup,
                                                   const TransportOptions& options) {
  auto t = std::make_unique<ucx::UcxTransport>(std::move(lookup), options);
  TP_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace tenplex::transport
