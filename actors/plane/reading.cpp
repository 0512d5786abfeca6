// The data plane's readers: frames read off a connection or a shared-memory ring, and
// payloads landed where their claimers wait.
#include "actors/plane/plane_internal.hpp"

namespace ps {

using namespace plane_internal;

// A payload that lands in a buffer of ours. One that is large grows its buffer with the
// bytes that come, not with what its header announced: four peers announcing 256 MiB
// each and sending nothing held 1 GB.
bool data_plane::read_payload(const payload_source& from, std::uint64_t bytes,
                              std::shared_ptr<std::vector<float>>& values, std::string* why) {
  constexpr std::uint64_t step = 16u << 20;
  if (bytes <= step) {
    values = buffers_->get(bytes / sizeof(float));
    iovec iov{values->data(), bytes};
    return from(&iov, 1, why);
  }
  values = buffers_->get(0);
  values->reserve(bytes / sizeof(float));  // address space only, until written
  for (std::uint64_t have = 0; have < bytes; have += step) {
    auto n = std::min(step, bytes - have);
    values->resize((have + n) / sizeof(float));
    iovec iov{reinterpret_cast<char*>(values->data()) + have, n};
    if (!from(&iov, 1, why)) return false;
  }
  return true;
}

bool data_plane::offer_ring(const std::shared_ptr<connection>& c) {
  if (ring_bytes_ == 0) return false;
  try {
    c->out_nonce = random_token();
    c->out_ring = shm_ring::create(c->out_nonce, ring_bytes_);
    c->out_ring->poll_before_waiting(poll_budget_);
  } catch (const bad_request& e) {
    log_line(log_level::warning, c->name + ": no shared memory (" + e.what() + "); payloads go over TCP");
    c->out_ring.reset();
    return false;
  }
  auto pid = static_cast<std::uint64_t>(::getpid());
  return send_or_queue(c, data_plane_frame{encode_bulk_header({bulk_kind::ring, c->out_nonce, pid}), {}, nullptr, 0,
                                           bulk_header_bytes});
}

// A ring the peer offered: mapped when this host has it (then the peer hears ring_ok),
// else its payloads keep coming over TCP.
void data_plane::take_ring(const std::shared_ptr<connection>& c, const bulk_header& h) {
  if (c->in_ring) throw bad_request("a second ring frame");
  std::string why = "this side keeps to TCP (--ps.shm-ring-bytes=0)";
  if (ring_bytes_ > 0) c->in_ring = shm_ring::open(static_cast<std::uint32_t>(h.bytes), h.id, &why);
  if (!c->in_ring) {
    log_line(log_level::debug, c->name + ": " + why + "; payloads come over TCP");
  } else {
    c->in_ring->poll_before_waiting(poll_budget_);
    // Payloads lent from the ring and not claimed yet (their claims may come only after
    // payloads still to come through it) are copied out when the writer needs their room.
    c->in_ring->when_held_by_lent([this, peer = c->peer.load()] {
      store_.own_lent(peer, std::bind_front(&data_plane::copied, this));
    });
  }
  send_or_queue(c, data_plane_frame{encode_bulk_header({bulk_kind::ring_ok, h.id, c->in_ring ? 1u : 0u}), {}, nullptr,
                                    0, bulk_header_bytes});
}

void data_plane::ring_answer(const std::shared_ptr<connection>& c, const bulk_header& h) {
  if (!c->out_ring || h.id != c->out_nonce) throw bad_request("ring_ok for a ring this side did not offer");
  if (h.bytes == 1) c->ring_ready = true;
  else c->out_ring.reset();  // the peer cannot map it (another host): let it go
  {
    std::lock_guard<std::mutex> guard(mtx_);
    c->ring_answered = true;
  }
  landed_.notify_all();
}

// A payload frame: its bytes, from the socket or the peer's ring, go where the claimer
// said (expect) or into a buffer of ours. False, with *why, when they did not all come.
bool data_plane::land(const std::shared_ptr<connection>& c, const bulk_header& h, std::string* why) {
  payload_source from = [&in = *c->in](iovec* iov, std::size_t n, std::string* w) { return in.read(iov, n, w); };
  const bool by_ring = h.kind == bulk_kind::ring_payload;
  if (by_ring) {
    if (!c->in_ring) throw bad_request("a ring payload on a connection without a ring");
    reader_waits(c);  // the ring's waits may sleep (set awake again once it landed)
    if (!c->in_ring->skip_to_record(h.bytes, [&] { return gone(*c); }, stall_timeout_, why)) {
      *why = "before payload " + std::to_string(h.id) + ": " + *why;
      return false;
    }
    from = [this, c](iovec* iov, std::size_t n, std::string* w) {
      std::vector<std::span<std::byte>> into;
      for (std::size_t i = 0; i < n; ++i) into.emplace_back(static_cast<std::byte*>(iov[i].iov_base), iov[i].iov_len);
      return c->in_ring->read(into, [&] { return gone(*c); }, stall_timeout_, w);
    };
  }
  std::optional<expectation> target;
  const auto key = std::make_pair(c->peer.load(), h.id);
  {
    std::lock_guard<std::mutex> guard(mtx_);
    if (auto it = expected_.find(key); it != expected_.end()) {
      target = std::move(it->second);
      expected_.erase(it);
      landing_.insert(key);  // forget() waits until the memory is left alone
    }
  }
  std::uint64_t target_bytes = 0;
  if (target)
    for (auto s : target->into) target_bytes += s.size_bytes();
  landed_values values;
  bool ok = false;
  if (target && target_bytes == h.bytes) {  // straight into place
    std::vector<iovec> iov;
    for (auto s : target->into) iov.push_back({s.data(), s.size_bytes()});
    ok = from(iov.data(), iov.size(), why);
  }
  if (target) {
    {
      std::lock_guard<std::mutex> guard(mtx_);
      landing_.erase(key);
    }
    landed_.notify_all();
  }
  if (!target || target_bytes != h.bytes)
    ok = by_ring ? land_from_ring(c, h, from, values, why) : read_payload(from, h.bytes, values.owned, why);
  if (!ok) {
    *why = "in the middle of payload " + std::to_string(h.id) + ": " + *why;
    return false;
  }
  c->reader_awake = true;
  bytes_received_ += h.bytes;
  store_.put(c->peer, h.id, std::move(values), h.bytes / sizeof(float));
  return true;
}

bool data_plane::land_from_ring(const std::shared_ptr<connection>& c, const bulk_header& h, const payload_source& from,
                                landed_values& values, std::string* why) {
  if (!lend_ || !c->in_ring->lendable(h.bytes) || h.bytes % sizeof(float) != 0)
    return read_payload(from, h.bytes, values.owned, why);
  auto lent = c->in_ring->lend(h.bytes, [&] { return gone(*c); }, stall_timeout_, why);
  if (!lent) return false;
  values.lent = std::shared_ptr<const float>(lent, reinterpret_cast<const float*>(lent.get()));
  return true;
}

void data_plane::read_frames(const std::shared_ptr<connection>& c, std::string* why) {
  // The actors this thread's messages woke run here once it has read all that came,
  // when it would wait for more (inline_runner), payloads included: with nothing more on
  // its way a shard's sum overlaps nothing, and handing it to the scheduler only added a
  // wake-up (BENCHMARKS.md, "A reader sums what nothing follows"). They go to the
  // scheduler instead when more is on its way (the socket has bytes), so that a shard
  // sums one chunk while this thread reads the next.
  std::optional<inline_runner> woken;
  if (sys_) woken.emplace(*sys_);
  for (;;) {
    if (woken && woken->waiting() > 0 && !c->in->buffered()) {
      if (c->in->drained()) {
        reader_runs_ += woken->waiting();  // before: what they send may be answered at once
        done_signal::wake_batch one_wake;  // the ops they complete wake their waiters once, after
        woken->run();
      } else {
        woken->hand_over();
      }
    }
    std::array<std::byte, bulk_header_bytes> raw;
    if (!c->in->read(raw.data(), raw.size(), why, true)) return;
    auto h = decode_bulk_header(raw);
    if (h.kind == bulk_kind::hello) {
      if (c->peer != 0) throw bad_request("a second hello frame");
      if (h.id == 0) throw bad_request("a hello frame without a token");
      store_.open_origin(h.id);
      c->peer = h.id;
      offer_ring(c);  // the peer proved the secret (if any) before its hello was read
      announce_messages(c);
      continue;
    }
    if (c->peer == 0) throw bad_request("a frame before the hello frame");
    if (h.kind == bulk_kind::ring) {
      take_ring(c, h);
    } else if (h.kind == bulk_kind::ring_ok) {
      ring_answer(c, h);
    } else if (h.kind == bulk_kind::message) {
      if (!deliver(c, h, woken ? &*woken : nullptr, why)) return;
    } else {
      if (woken) woken->hand_over();  // they need not wait for the payload's bytes
      c->in->note_payload();
      if (!land(c, h, why)) return;
    }
  }
}

void data_plane::read_loop(std::shared_ptr<connection> c) {
  own_plane = this;
  std::string why;
  c->in = std::make_unique<socket_reader>(c->fd, poll_budget_, polled_reads_, [this, weak = std::weak_ptr<connection>(c)] {
                                            if (auto c = weak.lock()) reader_waits(c);
                                          },
                                          c->reader_awake);
  if (c->accepted && secret_ && !challenge_peer(c->fd, *secret_, stall_timeout_, &why)) {
    drop(c, why);
    return;
  }
  try {
    read_frames(c, &why);
  } catch (const bad_request& e) {
    why = e.what();
  }
  drop(c, why);
}

}  // namespace ps
