// The data plane's writers: payloads offloaded, write batches that linger until a thread
// waits, and each connection's writer thread (socket or ring).
#include "actors/plane/plane_internal.hpp"

namespace ps {

using namespace plane_internal;

std::optional<float_block> data_plane::offload(std::uint64_t peer, const float_block& block) {
  if (block.ticket != 0 || !block.storage) return std::nullopt;
  std::span<const float> whole(block.data(), block.size);
  return offload(peer, std::span<const std::span<const float>>(&whole, 1), block.size, block.storage);
}

std::optional<float_block> data_plane::offload(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                               std::uint64_t count, std::shared_ptr<const void> keep) {
  return offload_frame(peer, parts, count, next_ticket_.fetch_add(1), std::move(keep), false);
}

void data_plane::expect(std::uint64_t peer, std::uint64_t ticket, std::vector<std::span<float>> into,
                        std::shared_ptr<const void> keep) {
  std::lock_guard<std::mutex> guard(mtx_);
  expected_[{peer, ticket}] = expectation{std::move(into), std::move(keep)};
}

void data_plane::forget(std::uint64_t peer, std::uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mtx_);
  auto key = std::make_pair(peer, ticket);
  expected_.erase(key);
  // A landing under way ends within the receive timeout (stall_timeout_) at the latest.
  landed_.wait_for(lock, stall_timeout_ + std::chrono::seconds(1), [&] { return !landing_.count(key); });
}

std::optional<float_block> data_plane::offload(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                               std::uint64_t count, std::uint64_t ticket,
                                               std::shared_ptr<const void> keep) {
  return offload_frame(peer, parts, count, ticket, std::move(keep), true);
}

std::optional<float_block> data_plane::offload_frame(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                                     std::uint64_t count, std::uint64_t ticket,
                                                     std::shared_ptr<const void> keep, bool expected) {
  if (count * sizeof(float) < min_bytes_ || peer == 0 || ticket == 0) return std::nullopt;
  if (!in_pieces(parts.size(), count)) return std::nullopt;
  std::shared_ptr<connection> c;
  {
    std::lock_guard<std::mutex> guard(mtx_);
    for (auto& x : conns_)
      if (x->peer == peer) c = x;
  }
  if (!c) return std::nullopt;
  data_plane_frame frame{encode_bulk_header({bulk_kind::payload, ticket, count * sizeof(float)}),
                         {parts.begin(), parts.end()}, std::move(keep), ticket, bulk_header_bytes + count * sizeof(float)};
  frame.streams = expected && count * sizeof(float) > streamed_above_;
  if (!send_or_queue(c, std::move(frame))) return std::nullopt;
  bytes_sent_ += count * sizeof(float);
  return named_payload(token_, ticket, count);
}

namespace {

// Appends the frame's header and parts not yet written to iov, as pieces for sendmsg.
void append_pieces_left(const data_plane_frame& frame, std::vector<iovec>& iov) {
  const auto first = iov.size();
  iov.push_back({const_cast<std::byte*>(frame.header.data()), frame.header.size()});
  for (auto p : frame.parts) iov.push_back({const_cast<float*>(p.data()), p.size_bytes()});
  iovec* at = iov.data() + first;
  std::size_t n = iov.size() - first;
  consume(at, n, frame.done);
  iov.erase(iov.begin() + static_cast<std::ptrdiff_t>(first), iov.begin() + (at - iov.data()));
}

// The frames' headers and parts not yet written, in order, as pieces for sendmsg.
std::vector<iovec> pieces_left(std::span<const data_plane_frame> frames) {
  std::vector<iovec> iov;
  for (const auto& f : frames) append_pieces_left(f, iov);
  return iov;
}

// The socket's header of a payload whose floats go through the ring.
auto ring_header(const data_plane_frame& frame) {
  return encode_bulk_header({bulk_kind::ring_payload, frame.ticket, frame.bytes - bulk_header_bytes});
}

// Whether the frame goes on the socket alone (not a payload through the ring).
bool plain(const data_plane_frame& frame, bool ring_ready) {
  return frame.ticket == 0 || frame.done > 0 || !ring_ready;
}

// The plain frames at the front of a queue, taken out for one write: as many as fit in
// iov_max pieces, one at least.
std::vector<data_plane_frame> take_plain_front(std::deque<data_plane_frame>& outbox, bool ring_ready) {
  std::vector<data_plane_frame> frames;
  std::size_t pieces = 0;
  while (!outbox.empty() && plain(outbox.front(), ring_ready)) {
    pieces += outbox.front().parts.size() + 1;
    if (!frames.empty() && pieces > iov_max) break;
    frames.push_back(std::move(outbox.front()));
    outbox.pop_front();
  }
  return frames;
}

// After `written` bytes of frames went out: those not finished go back to the front of
// the queue, in order. True when all went out.
bool put_back_unwritten(std::vector<data_plane_frame>& frames, std::uint64_t written,
                        std::deque<data_plane_frame>& outbox) {
  auto first_left = frames.begin();
  for (; first_left != frames.end(); ++first_left) {
    const auto left = first_left->bytes - first_left->done;
    if (written < left) break;
    written -= left;
  }
  if (first_left != frames.end()) first_left->done += written;
  outbox.insert(outbox.begin(), std::make_move_iterator(first_left), std::make_move_iterator(frames.end()));
  return first_left == frames.end();
}

thread_local write_batch* open_batch = nullptr;

}  // namespace

write_batch* write_batch::open() { return open_batch; }

write_batch::scope::scope(write_batch& batch) : opened_(open_batch == nullptr) {
  if (opened_) open_batch = &batch;
}

write_batch::scope::~scope() {
  if (opened_) open_batch = nullptr;
}

void write_batch::release() {
  auto held = std::move(held_);
  held_.clear();
  for (auto& h : held) {
    std::shared_lock<std::shared_mutex> guard(h.link->mtx);
    if (!h.link->plane) continue;
    if (!lingering_)
      h.link->plane->release(h.conn);
    else if (h.link->plane->linger(h.conn))
      lingers_.push_back(std::move(h));
  }
}

void write_batch::flush_lingering() {
  auto lingers = std::move(lingers_);
  lingers_.clear();
  for (auto& h : lingers) {
    std::shared_lock<std::shared_mutex> guard(h.link->mtx);
    if (h.link->plane) h.link->plane->unlinger(h.conn);
  }
}

bool data_plane::hold_in_batch(write_batch& batch, const std::shared_ptr<connection>& c, data_plane_frame frame) {
  std::unique_lock<std::mutex> lock(c->out_mtx);
  if (c->broken) return false;
  const bool large = frame.bytes >= write_batch::hold_bytes;
  c->outbox.push_back(std::move(frame));
  auto& held = batch.held_;
  if (std::none_of(held.begin(), held.end(), [&](const auto& h) { return h.conn == c; })) {
    held.push_back({link_, c});
    ++c->holds;
  }
  if ((large || c->outbox.size() >= write_batch::hold_frames) && !c->writing) flush_at_once(c, lock);
  return true;  // queued: a failed write drops c, which fails what was queued
}

void data_plane::flush_at_once(const std::shared_ptr<connection>& c, std::unique_lock<std::mutex>& lock) {
  bool out = true;
  // Each write lets go of the lock at its end (a frame's `keep` goes without it), and
  // another thread (the writer thread, another batch's flush) may then take the next
  // frames and be writing: this one stops there, or two threads would write to the socket
  // and the ring at once (frames interleaved, payloads overwritten in the ring).
  while (out && !c->outbox.empty() && !c->broken && !c->writing) {
    auto frames = take_plain_front(c->outbox, c->ring_ready);
    out = frames.empty() ? ring_front_at_once(c, lock) : plain_at_once(c, lock, frames);
  }
  if (!c->outbox.empty()) c->out_ready.notify_all();  // what is left is the writer thread's
}

bool data_plane::plain_at_once(const std::shared_ptr<connection>& c, std::unique_lock<std::mutex>& lock,
                               std::vector<data_plane_frame>& frames) {
  c->writing = true;
  lock.unlock();
  auto iov = pieces_left(frames);
  ++socket_writes_;
  auto k = write_now(c->fd, iov.data(), iov.size());
  const auto error = errno;
  lock.lock();
  c->writing = false;
  if (k < 0) {
    lock.unlock();
    c->out_ready.notify_all();
    drop(c, std::string("writing frames: ") + std::strerror(error));
    lock.lock();
    return false;
  }
  const auto all = put_back_unwritten(frames, static_cast<std::uint64_t>(k), c->outbox);
  lock.unlock();
  frames.clear();  // written: their `keep`s go (a write_signal tells its tracker) without the lock
  lock.lock();
  return all;
}

// The ring payload at the front of c's queue, written by this thread when the ring has
// room for all its floats (as send_or_queue writes one: no hop to the writer thread, which
// cost a wake-up and two context switches per payload sent from a write batch).
bool data_plane::ring_front_at_once(const std::shared_ptr<connection>& c, std::unique_lock<std::mutex>& lock) {
  auto& front = c->outbox.front();
  if (front.floats_in_ring || !c->out_ring->fits_now(front.bytes - bulk_header_bytes)) return false;
  auto frame = std::move(front);
  c->outbox.pop_front();
  auto out = write_front_at_once(c, lock, frame, true);
  if (!out || !*out) return false;
  lock.unlock();
  frame = {};  // written: its `keep` goes without the lock
  lock.lock();
  return true;
}

std::optional<bool> data_plane::write_front_at_once(const std::shared_ptr<connection>& c,
                                                    std::unique_lock<std::mutex>& lock, data_plane_frame& frame,
                                                    bool by_ring) {
  c->writing = true;
  lock.unlock();
  auto out = write_at_once(c, frame, by_ring);
  const auto why = out ? std::string() : errno_text();
  lock.lock();
  c->writing = false;
  if (!out) {
    lock.unlock();
    c->out_ready.notify_all();
    drop(c, "writing payload " + std::to_string(frame.ticket) + ": " + why);
    lock.lock();
    return std::nullopt;
  }
  if (!*out) c->outbox.push_front(std::move(frame));  // its rest, ahead of frames queued meanwhile
  return out;
}

void data_plane::release(const std::shared_ptr<connection>& c) {
  std::unique_lock<std::mutex> lock(c->out_mtx);
  if (--c->holds > 0 || c->broken || c->outbox.empty()) return;
  if (c->writing)
    c->out_ready.notify_all();  // the writer thread goes on with what waits
  else
    flush_at_once(c, lock);
}

bool data_plane::linger(const std::shared_ptr<connection>& c) {
  std::unique_lock<std::mutex> lock(c->out_mtx);
  bool watched = false;  // what waits will be written by a reader or a waiting caller
  if (!c->broken && !c->outbox.empty()) {
    if (c->lingers) {
      watched = true;  // another batch's linger holds it (and now ours)
    } else if (c->holds == 1 && (c->reader_awake || answers_due(*c))) {
      c->lingers = true;  // keeps the batch's hold
      return true;
    }
  }
  lock.unlock();
  release(c);
  return watched;
}

// Called with c's out_mtx held: requests asked on c count from before their write, so
// those still queued are taken off.
bool data_plane::answers_due(connection& c) {
  const auto queued = std::count_if(c.outbox.begin(), c.outbox.end(), [](const auto& f) { return f.request; });
  std::lock_guard<std::mutex> guard(c.asked_mtx);
  return c.asked.size() > static_cast<std::size_t>(queued);
}

void data_plane::unlinger(const std::shared_ptr<connection>& c) {
  {
    std::lock_guard<std::mutex> guard(c->out_mtx);
    if (!c->lingers) return;
    c->lingers = false;
  }
  release(c);
}

void data_plane::reader_waits(const std::shared_ptr<connection>& c) {
  {
    std::lock_guard<std::mutex> guard(c->out_mtx);
    c->reader_awake = false;
  }
  unlinger(c);
}

// What goes at once of a frame nothing is queued before, without waiting: on the socket,
// what it takes; through the ring (which has room for all of it), the floats and what the
// socket takes of the header, the header first when the frame streams. True when the
// frame is out, false when the writer thread must finish it (frame says where it stands),
// nothing on an error.
std::optional<bool> data_plane::write_at_once(const std::shared_ptr<connection>& c, data_plane_frame& frame,
                                              bool by_ring) {
  if (!by_ring) {
    auto iov = pieces_left({&frame, 1});
    ++socket_writes_;
    auto k = write_now(c->fd, iov.data(), iov.size());
    if (k < 0) return std::nullopt;
    frame.done += static_cast<std::uint64_t>(k);
    return frame.done == frame.bytes;
  }
  std::string why;
  auto header = ring_header(frame);
  iovec head{header.data(), header.size()};
  if (!frame.streams && !into_ring(c, frame, {}, &why)) return std::nullopt;  // room was there: no wait
  auto k = write_now(c->fd, &head, 1);
  if (k < 0) return std::nullopt;
  if (frame.streams) {
    ++streamed_payloads_;
    if (!into_ring(c, frame, {}, &why)) return std::nullopt;
  }
  frame.floats_in_ring = true;
  frame.ring_header_done = static_cast<std::size_t>(k);  // the writer thread goes on from there
  return frame.ring_header_done == header.size();
}

// Writes what goes at once when nothing is queued before the frame (most frames: no
// thread hop; a ring payload when the ring has room for all of it), and queues the rest
// for the writer thread. Never waits for the socket. False when the connection is broken
// (the caller sends the block).
bool data_plane::send_or_queue(const std::shared_ptr<connection>& c, data_plane_frame frame) {
  if (auto* batch = write_batch::open()) return hold_in_batch(*batch, c, std::move(frame));
  std::unique_lock<std::mutex> lock(c->out_mtx);
  if (c->broken) return false;
  const bool by_ring = frame.ticket != 0 && c->ring_ready;
  const bool idle = c->outbox.empty() && !c->writing && c->holds == 0;
  if (idle && (!by_ring || c->out_ring->fits_now(frame.bytes - bulk_header_bytes))) {
    if (!write_front_at_once(c, lock, frame, by_ring)) return false;
    // What is queued now (frames queued meanwhile, this one's rest) is the writer's; with
    // nothing, it sleeps on (a wake-up per message cost a thread switch each way).
    if (!c->outbox.empty()) c->out_ready.notify_all();
    return true;
  }
  c->outbox.push_back(std::move(frame));
  c->out_ready.notify_all();
  return true;
}

// A payload through the ring, all of it, and its header on the socket (ring_header_done
// of it may be out already). Floats that fit in the ring's room go in before the header:
// the reader, woken by the header, copies them out at once; woken first, it slept on the
// ring until this copy ended, a second wake-up per payload (2x2 at 64 KiB moved less
// than over TCP). A payload larger than the room, or one that streams (an answer larger
// than stream_answers_above), goes behind its header, the reader copying out as this thread copies
// in. False, with *why, when it could not be written.
bool data_plane::write_ring_payload(const std::shared_ptr<connection>& c, const data_plane_frame& frame,
                                    std::string* why) {
  const auto alive = [&] { return gone(*c); };
  const bool floats_first =
      !frame.floats_in_ring && !frame.streams && c->out_ring->fits_now(frame.bytes - bulk_header_bytes);
  if (floats_first && !into_ring(c, frame, alive, why)) return false;
  if (!floats_first && !frame.floats_in_ring) ++streamed_payloads_;
  auto header = ring_header(frame);
  iovec head{header.data() + frame.ring_header_done, header.size() - frame.ring_header_done};
  if (!write_all(c->fd, &head, 1)) {
    *why = stall_or_error(stall_timeout_);
    return false;
  }
  return frame.floats_in_ring || floats_first || into_ring(c, frame, alive, why);
}

// Plain frames, all of them, in as few sendmsg calls as IOV_MAX allows.
bool data_plane::write_plain(const std::shared_ptr<connection>& c, std::span<const data_plane_frame> frames,
                             std::string* why) {
  auto iov = pieces_left(frames);
  ++socket_writes_;
  bool ok = true;
  for (std::size_t at = 0; ok && at < iov.size(); at += iov_max)
    ok = write_all(c->fd, iov.data() + at, static_cast<int>(std::min(iov_max, iov.size() - at)));
  if (!ok) *why = stall_or_error(stall_timeout_);
  return ok;
}

// A payload's floats into c's ring (after its header went on the socket), counted as sent
// through shared memory before the write: the peer may have read the last byte and its
// claimer returned before this thread is scheduled again (as bytes_sent_ is counted when
// the payload is handed over). A write that fails takes its count back.
bool data_plane::into_ring(const std::shared_ptr<connection>& c, const data_plane_frame& frame,
                           const shm_ring::alive_check& alive, std::string* why) {
  std::vector<std::span<const std::byte>> pieces;
  for (auto p : frame.parts) pieces.push_back(std::as_bytes(p));
  const auto bytes = frame.bytes - bulk_header_bytes;
  shm_bytes_sent_ += bytes;
  if (c->out_ring->write(pieces, alive, stall_timeout_, why)) return true;
  shm_bytes_sent_ -= bytes;
  return false;
}

// The connection's writer thread: writes the queued payloads in order until the
// connection ends or the plane stops. A write that fails ends the connection, so every
// claim of its payloads fails at once at the receiver, naming it.
void data_plane::write_loop(std::shared_ptr<connection> c) {
  own_plane = this;
  for (;;) {
    std::vector<data_plane_frame> frames;  // plain ones together: one sendmsg for a burst of small frames
    bool by_ring = false;
    {
      std::unique_lock<std::mutex> lock(c->out_mtx);
      c->out_ready.wait(lock, [&] {
        return c->broken || stopping_ || (!c->outbox.empty() && !c->writing && c->holds == 0);
      });
      if (c->broken || stopping_) return;
      frames = take_plain_front(c->outbox, c->ring_ready);
      by_ring = frames.empty();  // a payload through the ring is first
      if (by_ring) {
        frames.push_back(std::move(c->outbox.front()));
        c->outbox.pop_front();
      }
      c->writing = true;
    }
    ++writer_thread_writes_;
    std::string why;
    bool ok = by_ring ? write_ring_payload(c, frames.front(), &why) : write_plain(c, frames, &why);
    const auto ticket = frames.front().ticket;
    {
      std::lock_guard<std::mutex> guard(c->out_mtx);
      c->writing = false;
    }
    c->out_ready.notify_all();
    if (ok) continue;
    drop(c, "writing payload " + std::to_string(ticket) + ": " + why);
    return;
  }
}

}  // namespace ps
