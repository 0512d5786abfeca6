// Pushes, pulls and inits by chunks: each chunk's sending, its answer (claimed from the
// data plane when it names a payload) and its replanning after a map change.
#include "actors/client/client_state.hpp"
#include "libps/net/bulk.hpp"  // payload_lost

namespace ps::client_internal {

// One chunk of a request on its way to shard idx: what every sending of it needs.
struct chunk_send {
  client_ptr self;
  std::shared_ptr<op_request> req;  // the chunk stays in req (kept alive here): read there, not copied
  std::size_t c;                    // the chunk's index in req
  std::size_t idx;                  // the shard's route
  request_header hdr;               // numbered once, for every sending
};

void request_failed(client_ptr self, std::size_t idx, std::uint64_t tag, const caf::error& err,
                    const std::string& what);

void pull_landed(const chunk_send& s, float_block& values);

// Before a pull chunk counts as answered or failed, nothing may still land in it. An
// answer that names its payload needs none once claimed: the claim ends when the payload
// landed, and a landing takes the expectation. Otherwise this waits for a landing under
// way, which only a failed or duplicate answer can meet (an answer that came inline has
// no payload to land).
void withdraw_landing(const chunk_send& s) {
  if (!s.req->landing.empty() && s.req->landing[s.c] != 0) s.self->state.plane->forget(s.req->landing[s.c], s.hdr.seq);
}

void queue_chunk(client_ptr self, const std::shared_ptr<op_request>& req, std::size_t c, bool ticks);

// How often one pull chunk is asked again for a payload that was lost.
constexpr std::uint8_t max_payload_asks = 2;

// A pull chunk's answer named a payload that cannot come any more (errc::payload_lost):
// the copy that answered may have died before writing it, maybe before its process ever
// connected to this one (then no end of a connection tells, only the claim timeout). A
// read is safe to ask again: it goes to the chunk's shard as the client knows it now (after
// a failover, the new tail). False when it was asked again enough, or its shard is gone.
bool ask_again_for_payload(const chunk_send& s, const std::string& why) {
  auto& st = s.self->state;
  auto& req = *s.req;
  if (req.payload_asks.empty()) req.payload_asks.resize(req.chunks.size());
  if (req.payload_asks[s.c] >= max_payload_asks || req.op->done_flag() || !st.index.count(req.chunks[s.c].shard))
    return false;
  ++req.payload_asks[s.c];
  log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": pull of " + describe_keys(req.chunks[s.c]) +
                                   ": " + why + "; asking " + st.routes[s.idx].link.name + " again");
  queue_chunk(s.self, s.req, s.c, false);  // its part of the result is copied in (landing stays taken)
  return true;
}

// A pull's answer: claimed (it may come over the data plane, and may still be on its way
// there: then the claimer answers once it landed), then checked and put in place.
void pull_answered(const chunk_send& s, float_block& values) {
  auto& st = s.self->state;
  auto failed = [s](const std::string& why, bool lost) {
    withdraw_landing(s);
    if (lost && ask_again_for_payload(s, why)) return;
    s.req->op->finish("pull of " + describe_keys(s.req->chunks[s.c]) + " failed: " +
                      s.self->state.routes[s.idx].link.name + ": " + why);
  };
  std::optional<float_block> claimed;
  try {
    claimed = claim_values(st.plane.get(), values);
  } catch (const bad_request& e) {
    return failed(e.what(), dynamic_cast<const payload_lost*>(&e) != nullptr);
  }
  if (claimed) return pull_landed(s, *claimed);
  auto awaited = st.awaited_payloads.emplace(s.idx, values.origin);
  auto arrived = [s, awaited] { s.self->state.awaited_payloads.erase(awaited); };
  s.self->request(st.claimer, caf::infinite, claim_atom::value, values)
    .then(
      [s, arrived](float_block& landed) {
        arrived();
        pull_landed(s, landed);
      },
      [failed, arrived](caf::error& err) {
        arrived();
        failed(describe(err), code_of(err) == errc::payload_lost);
      });
}

void pull_landed(const chunk_send& s, float_block& values) {
  auto& st = s.self->state;
  const auto& ch = s.req->chunks[s.c];
  auto op = s.req->op;
  auto& route = st.routes[s.idx];
  if (route.down_since) {  // the first pull after a failover: recovery time
    auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - *route.down_since).count();
    route.down_since.reset();
    std::lock_guard<std::mutex> guard(st.stats->mtx);
    st.stats->recoveries_ms.push_back(ms);
  }
  if (values.size != ch.num_values) {
    op->finish("pull of " + describe_keys(ch) + " failed: " + route.link.name + " sent " + std::to_string(values.size) +
               " values for " + std::to_string(ch.num_values) + " keys");
    return;
  }
  if (!s.req->in_place) {  // the common case: one chunk, its answer is the result
    if (values.whole())
      op->values = std::move(*values.storage);
    else
      op->values.assign(values.data(), values.data() + values.size);
  } else if (values.storage) {  // else it landed in place
    scatter(values.data(), ch, op->values.data());
  }
  chunk_answered(op.get());
}

void send_pull(const chunk_send& s, std::uint64_t tag, request_header h) {
  auto self = s.self;
  auto& st = self->state;
  auto req = s.req;
  auto c = s.c;
  const auto& ch = req->chunks[c];
  auto tail = tail_of(st.routes[s.idx]);
  if (auto peer = h.pull_codec == 0 ? plane_peer(self, tail) : 0) {
    h.reply_plane = st.plane->token();
    // A piece of a larger answer: its payload is read straight into place.
    if (!req->landing.empty() && req->landing[c] == 0 && in_pieces(ch.pieces.size(), ch.num_values)) {
      std::vector<std::span<float>> into;
      for (const auto& p : ch.pieces) into.emplace_back(req->op->values.data() + p.value_offset, p.keys.size());
      st.plane->expect(peer, h.seq, std::move(into), req->op);
      req->landing[c] = peer;
    }
  }
  auto unexpect = [s] { withdraw_landing(s); };
  ask_shard(self, s.idx, tag, tail, pull_atom::value, h, range_list{ch.ranges()})
    .then(
      [=](float_block& values) {
        if (!settle(self, s.idx, tag)) return unexpect();  // answered already
        if (values.ticket == 0) unexpect();                 // inline: nothing will land in the places named
        pull_answered(s, values);
      },
      [=](caf::error& err) {
        // A sending taken for a failover: its landing, if any, is the next sending's.
        if (!self->state.core.at(s.idx).sent.count(tag)) return;
        unexpect();
        request_failed(self, s.idx, tag, err, std::string(names_of(req->kind)) + " of " + describe_keys(req->chunks[c]));
      });
}

// A push or init: a large block goes over the data connection and the message names it;
// a chunk of scattered pieces is written straight from the caller's buffer if it can be.
void send_values(const chunk_send& s, std::uint64_t tag, const request_header& h) {
  auto self = s.self;
  auto& st = self->state;
  auto req = s.req;
  auto c = s.c;
  const auto& ch = req->chunks[c];
  auto handle = head_of(st.routes[s.idx]);
  auto acked = [=](std::uint64_t) {
    if (!settle(self, s.idx, tag)) return;
    auto& tick = self->state.routes[s.idx].acked_tick;
    tick = std::max(tick, s.hdr.tick);  // a failover resends from here
    chunk_answered(req->op.get());
  };
  auto on_error = [=](caf::error& err) {  // the text is built only when needed
    request_failed(self, s.idx, tag, err, std::string(names_of(req->kind)) + " of " + describe_keys(req->chunks[c]));
  };
  range_list ranges{ch.ranges()};
  if (!req->encoded.empty()) {
    ask_shard(self, s.idx, tag, handle, push_atom::value, h, std::move(ranges), req->encoded[c]).then(acked, on_error);
    return;
  }
  auto block = req->blocks[c];
  auto peer = plane_peer(self, handle);
  std::optional<float_block> named;
  if (peer && !block.storage) {
    std::vector<std::span<const float>> parts;
    for (const auto& p : ch.pieces) parts.emplace_back(req->source->data() + req->base + p.value_offset, p.keys.size());
    named = st.plane->offload(peer, parts, ch.num_values, req->source);  // the source is not changed after the push
  }
  if (!named && !block.storage) {  // gathered after all (kept for resends)
    std::vector<float> gathered(ch.num_values);
    gather(req->source->data() + req->base, ch, gathered.data());
    block = req->blocks[c] = float_block::own(std::move(gathered));
  }
  if (peer && !named) named = st.plane->offload(peer, block);
  if (named) block = std::move(*named);
  if (req->kind == op_kind::push)
    ask_shard(self, s.idx, tag, handle, push_atom::value, h, std::move(ranges), std::move(block)).then(acked, on_error);
  else
    ask_shard(self, s.idx, tag, handle, init_atom::value, h, std::move(ranges), std::move(block)).then(acked, on_error);
}

std::uint64_t count_keys_of(const std::vector<chunk>& chunks) {
  std::uint64_t n = 0;
  for (const auto& c : chunks) n += c.num_values;
  return n;
}

// A push, pull or init split into chunks: each is queued to its shard, numbered here in
// the order the shards will see them (callers on several threads could otherwise
// overtake each other): duplicate filters rely on it.
// With then_tick: the index of the last chunk to each shard (it carries the tick), and
// the shards no chunk reaches (they get a plain tick).
std::map<std::size_t, std::size_t> last_chunks(client_ptr self, const op_request& req,
                                               std::vector<std::size_t>& untouched) {
  auto& st = self->state;
  std::map<std::size_t, std::size_t> last;  // route -> chunk
  for (std::size_t c = 0; c < req.chunks.size(); ++c) last[st.index.at(req.chunks[c].shard)] = c;
  for (std::size_t idx = 0; idx < st.routes.size(); ++idx)
    if (!last.count(idx) && !st.routes[idx].retired) untouched.push_back(idx);
  return last;
}

void replan_pull(const chunk_send& s);

// Chunk c of req, queued to its shard (numbered now: see last_chunks); `ticks`: it
// carries the clock tick for that shard.
void queue_chunk(client_ptr self, const std::shared_ptr<op_request>& req, std::size_t c, bool ticks) {
  auto& st = self->state;
  const auto& ch = req->chunks[c];
  chunk_send s{self, req, c, st.index.at(ch.shard), req->hdr};
  s.hdr.seq = next_sequence();
  if (ticks) s.hdr.tick = req->then_tick;
  pending_request r;
  r.op = req->op;
  r.tick = ticks;  // with retries it waits for the requests before it, as a tick does
  r.read = req->kind == op_kind::pull;
  r.write = !r.read;
  r.plan_epoch = req->hdr.epoch;
  r.bytes = (req->encoded.empty() ? ch.num_values * sizeof(float) : req->encoded[c].bytes->size()) + ch.header_bytes();
  if (r.read) r.replan = [s] { replan_pull(s); };
  r.send = [s](std::uint64_t tag) {
    if (s.req->kind == op_kind::pull)
      send_pull(s, tag, s.hdr);
    else
      send_values(s, tag, s.hdr);
  };
  submit(s.self, s.idx, std::move(r));
}

// The pieces of req's chunks cut again by the client's map (keeping where their values sit).
std::vector<piece> pieces_by_map(const client_state& st, const std::vector<chunk>& chunks) {
  std::vector<piece> out;
  for (const auto& ch : chunks)
    for (const auto& p : ch.pieces)
      for (auto q : st.map->split(key_set::single(p.keys))) {
        q.value_offset += p.value_offset;
        out.push_back(q);
      }
  std::sort(out.begin(), out.end(), [](const piece& a, const piece& b) { return a.keys.begin < b.keys.begin; });
  return out;
}

// A request the caller planned by an older map than the client's (the client learned the
// new one meanwhile): planned again by the client's map before anything is sent, so it
// names no shard that left, and its tick is one of the new map (a shard that took keys
// ignores older ticks: they could overtake writes passed on to it). A push's values come
// from its source (a compressed push's decoded, as the shard would apply them).
void replan_request(client_ptr self, op_request& req) {
  auto& st = self->state;
  if (req.kind != op_kind::pull && !req.encoded.empty()) {
    std::uint64_t total = 0;
    for (const auto& ch : req.chunks)
      for (const auto& p : ch.pieces) total = std::max(total, p.value_offset + p.keys.size());
    auto source = std::make_shared<std::vector<float>>(total);
    for (std::size_t c = 0; c < req.chunks.size(); ++c) {
      std::vector<float> values(req.chunks[c].num_values);
      decode(std::span<const std::byte>(*req.encoded[c].bytes), values.data(), values.size());
      scatter(values.data(), req.chunks[c], source->data());
    }
    req.source = source;
    req.base = 0;
    req.encoded.clear();
  }
  auto keys = req.chunks.empty() ? 0 : count_keys_of(req.chunks);
  req.chunks = plan_chunks(pieces_by_map(st, req.chunks), st.chunk_bytes[static_cast<std::size_t>(req.kind)]);
  req.hdr.epoch = st.core.map_epoch();
  if (req.kind == op_kind::pull) {
    if (!req.in_place) req.op->values.resize(keys);
    req.in_place = true;
    req.landing.clear();
    return;
  }
  req.blocks.clear();
  for (const auto& c : req.chunks) {
    if (c.contiguous()) {
      req.blocks.push_back({req.source, req.base + c.first_offset(), c.num_values});
      continue;
    }
    std::vector<float> gathered(c.num_values);
    gather(req.source->data() + req.base, c, gathered.data());
    req.blocks.push_back(float_block::own(std::move(gathered)));
  }
}

void dispatch(client_ptr self, const std::shared_ptr<op_request>& req) {
  auto& st = self->state;
  if (req->hdr.epoch < st.core.map_epoch()) replan_request(self, *req);
  auto op = req->op;
  std::vector<std::size_t> untouched;
  auto last = req->then_tick ? last_chunks(self, *req, untouched) : std::map<std::size_t, std::size_t>{};
  st.issued_tick = std::max(st.issued_tick, req->then_tick);
  op->pending = req->chunks.size() + untouched.size();
  if (op->pending == 0) {
    op->finish({});
    return;
  }
  for (std::size_t c = 0; c < req->chunks.size(); ++c)
    queue_chunk(self, req, c, req->then_tick && last.at(st.index.at(req->chunks[c].shard)) == c);
  for (auto idx : untouched)
    submit(self, idx, clock_request(self, idx, request_header{req->hdr.epoch, req->hdr.worker, req->then_tick, 0}, op));
}

// A pull chunk whose keys moved (a shard joined): its pieces cut again by the newest
// map, each new chunk landing where the old one would have.
void replan_pull(const chunk_send& s) {
  auto self = s.self;
  auto& st = self->state;
  const auto& ch = s.req->chunks[s.c];
  auto pieces = pieces_by_map(st, {ch});
  auto again = std::make_shared<op_request>();
  again->kind = op_kind::pull;
  again->hdr = s.req->hdr;
  again->hdr.epoch = st.core.map_epoch();
  again->op = s.req->op;
  again->chunks = plan_chunks(pieces, st.chunk_bytes[static_cast<std::size_t>(op_kind::pull)]);
  again->in_place = true;
  if (!s.req->in_place) again->op->values.resize(ch.num_values);  // one chunk: its answer was to be the result
  again->op->pending += again->chunks.size();
  for (std::size_t c = 0; c < again->chunks.size(); ++c) queue_chunk(self, again, c, false);
  chunk_answered(again->op.get());  // the moved chunk: its new chunks answer for it
}

}  // namespace ps::client_internal
