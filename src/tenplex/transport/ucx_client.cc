// The UCX transport, client side: Fetch (ucx_internal.h).
#include "tenplex/transport/ucx_internal.h"

namespace tenplex::transport::ucx {

void UcxTransport::Scatter(const char* src, const std::vector<ucp_dt_iov_t>& pieces) {
  for (const ucp_dt_iov_t& piece : pieces) {
    std::memcpy(piece.buffer, src, piece.length);
    src += piece.length;
  }
}

Result<PeerId> UcxTransport::DoConnect(const std::string& token, const std::string& bytes) {
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

void UcxTransport::EpErrorCb(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<UcxTransport*>(arg);
  auto it = self->peer_by_ep_.find(ep);
  if (it == self->peer_by_ep_.end()) return;
  Peer* p = self->peers_.at(it->second).get();
  self->FailPeer(p, Unavailable("lost the connection to peer " + std::to_string(p->id) + ": " +
                                UcsError(status)));
}

void UcxTransport::StartCall(Call* call, PeerId peer_id, const std::vector<ReadRequest>& requests) {
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
      p->header =
          RequestHeader{kProtocolVersion, count, p->id, static_cast<uint32_t>(q.region.size()),
                        static_cast<uint32_t>(q.capability.size())};
      p->payload = EncodeRequestPayload(q.region, p->runs.data(), count, q.capability);
      peer->pending.insert(p.get());
      peer->waiting.push_back(p.get());
      pending_[p->id] = std::move(p);
      ++started;
    }
  }
  call->remaining = started;
  SendWaiting(peer);
}

void UcxTransport::SendWaiting(Peer* peer) {
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

void UcxTransport::FinishCall(Call* call, Status result) {
  std::lock_guard<std::mutex> l(call->mu);
  call->result = std::move(result);
  call->done = true;
  call->cv.notify_all();
}

void UcxTransport::FailPending(Pending* p, const Status& s) {
  if (p->status.ok()) p->status = s;
}

void UcxTransport::AddReceived(Pending* p, uint64_t n) {
  p->received += n;
  p->peer->last_activity = Clock::now();
  if (p->received > p->starts.back()) {
    FailPending(
        p, DataLoss("peer " + std::to_string(p->peer->id) + " sent more bytes than requested"));
  } else if (p->received == p->starts.back()) {
    p->all_data = true;
  }
}

void UcxTransport::QueueFinish(Pending* p) {
  if (!p->queued) {
    p->queued = true;
    finish_queue_.push_back(p);
  }
}

void UcxTransport::FailPeer(Peer* peer, const Status& s) {
  if (peer->failure.ok()) peer->failure = s;
  for (Pending* p : peer->pending) {
    FailPending(p, s);
    QueueFinish(p);
  }
  peer->waiting.clear();
  if (peer->ep != nullptr) close_queue_.push_back(peer->id);
}

bool UcxTransport::ProcessDeferred() {
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

void UcxTransport::CheckTimeouts(Clock::time_point now) {
  for (auto& [id, peer] : peers_) {
    if (peer->inflight_bytes == 0 && peer->pending.size() == peer->waiting.size()) continue;
    if (!peer->failure.ok()) continue;
    if (now - peer->last_activity > options_.timeout) {
      FailPeer(peer.get(), Unavailable("peer " + std::to_string(id) + " sent nothing for " +
                                       std::to_string(options_.timeout.count()) + " ms"));
    }
  }
}

void UcxTransport::AbandonCalls() {
  for (auto& [id, p] : pending_) {
    std::lock_guard<std::mutex> l(p->call->mu);
    if (!p->call->done) {
      p->call->result = Aborted("the transport was destroyed during the fetch");
      p->call->done = true;
      p->call->cv.notify_all();
    }
  }
}

void UcxTransport::BeginShutdown() {
  for (auto& [id, peer] : peers_) {
    FailPeer(peer.get(), Aborted("the transport is shutting down"));
  }
}

ucs_status_t UcxTransport::OnData(const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
  DataHeader h;
  Pending* p = Match(header, header_length, &h);
  if (p == nullptr) return UCS_OK;
  const uint64_t total = p->starts.back();
  if (h.version != kProtocolVersion || h.stream_offset > total ||
      length > total - h.stream_offset) {
    FailPending(p,
                DataLoss("peer " + std::to_string(p->peer->id) + " sent a malformed data message"));
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
  params.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
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

ucs_status_t UcxTransport::OnStatus(const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param) {
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

}  // namespace tenplex::transport::ucx
