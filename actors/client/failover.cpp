// Shards that go down or leave, new maps, and reads refused because their keys moved.
#include "actors/client/client_state.hpp"

namespace ps::client_internal {

// A read refused because its keys moved: planned again by the newest map, or, when that
// map has not come yet, parked until it does (at most the request timeout).
void read_moved(client_ptr self, std::size_t idx, std::uint64_t tag) {
  auto& st = self->state;
  auto r = std::move(*st.core.settle(idx, tag));
  pump(self, idx);
  report_if_idle(self, idx);
  if (st.core.map_epoch() > r.plan_epoch) return r.replan();
  auto batch = st.next_moved_batch;
  if (st.moved_reads.empty() || st.moved_reads.rbegin()->first != batch) {
    batch = ++st.next_moved_batch;
    self->delayed_send(self, st.timeout, handoff_atom::value, batch);
  }
  st.moved_reads[batch].push_back(std::move(r));
}

// A request failed. While its shard is down and a new map may come, it is kept to be
// sent again; otherwise its op fails with what went wrong.
void request_failed(client_ptr self, std::size_t idx, std::uint64_t tag, const caf::error& err,
                    const std::string& what) {
  auto& st = self->state;
  auto& sent = st.core.at(idx).sent;
  auto it = sent.find(tag);
  if (it == sent.end()) return;
  if (code_of(err) == errc::moved && it->second.replan) return read_moved(self, idx, tag);
  if (code_of(err) == errc::unsent) return send_again_through_caf(self, idx, tag);
  // Bounced by a copy that has ended (before its down message got here): the same news.
  if (err == caf::sec::request_receiver_down && st.routes[idx].down.empty() && !st.routes[idx].abandoned) {
    shard_down(self, idx, st.routes[idx].link.name + " is down (" + describe(err) + ")");
    it = sent.find(tag);  // shard_down may have failed it already (fail_all)
    if (it == sent.end()) return;
  }
  if (!st.routes[idx].down.empty() && st.coordinator && !st.routes[idx].abandoned) return;
  auto op = it->second.op;
  op->finish(what + " failed: " + why_failed(self, st.routes[idx].link, err));
  settle(self, idx, tag);
}

// Every request of a route, sent (in send order) then queued, taken out of it. The
// sendings taken are not answered under their tags any more: each one's CAF response
// handler is released with an error (else a dead shard's would be kept for good), which
// finds its tag gone and does nothing.
std::deque<pending_request> take_pending(client_ptr self, std::size_t idx) {
  for (auto& [tag, r] : self->state.core.at(idx).sent)
    if (r.answer_id.is_response()) answer_with_error(self, r.answer_id, caf::sec::request_receiver_down);
  return self->state.core.take_all(idx);
}

// Every request to shard idx (sent or queued) fails with `reason`; with ticks_done, its
// clock ticks count as done instead (a shard that left the map holds no keys: its clocks
// gate nothing).
void fail_all(client_ptr self, std::size_t idx, const std::string& reason, bool ticks_done) {
  auto& st = self->state;
  for (auto& r : take_pending(self, idx)) {
    if (ticks_done && r.tick) chunk_answered(r.op.get());
    else r.op->finish(r.op->what + " failed: " + reason);
  }
  lift_fence(self);
  report_if_idle(self, idx);
}

// Shard i is gone. Without a coordinator its requests fail now. Otherwise they wait for
// the new map (requests to a dead shard never fail on their own in CAF 0.17), at most
// the request timeout.
// Route i's shard is down and the coordinator too: no new map can come, so its requests,
// and later ones, fail now.
void abandon_for_coordinator(client_ptr self, std::size_t i) {
  auto& route = self->state.routes[i];
  route.abandoned = true;
  route.down += "; " + self->state.coordinator_down + ": no replacement can come";
  fail_all(self, i, route.down);
}

void shard_down(client_ptr self, std::size_t i, const std::string& reason, bool expected) {
  auto& st = self->state;
  st.routes[i].down = reason;
  for (auto it = st.awaited_payloads.lower_bound({i, 0}); it != st.awaited_payloads.end() && it->first == i; ++it)
    st.plane->origin_gone(it->second, reason);
  if (!st.coordinator_down.empty()) return abandon_for_coordinator(self, i);
  if (!st.coordinator) {
    fail_all(self, i, st.routes[i].down);
    return;
  }
  st.routes[i].down_since = std::chrono::steady_clock::now();
  if (expected)  // as shards do at the job's end; a replacement is still waited for, should the job go on
    log_line(log_level::info, "worker " + std::to_string(st.worker) + ": " + st.routes[i].down + ", as at the job's end");
  else
    log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": " + st.routes[i].down + "; waiting up to " +
                                     std::to_string(st.timeout.count()) + " ms for a replacement");
  self->delayed_send(self, st.timeout, failover_atom::value, static_cast<std::uint64_t>(i), st.routes[i].generation);
}

pending_request clock_request(client_ptr self, std::size_t idx, request_header hdr, std::shared_ptr<kv_op_state> op) {
  pending_request r;
  r.op = op;
  r.tick = true;
  r.plan_epoch = hdr.epoch;
  r.send = [=](std::uint64_t tag) {
    auto& st = self->state;
    ask_shard(self, idx, tag, head_of(st.routes[idx]), clock_atom::value, hdr)
      .then(
        [=](std::uint64_t) {
          if (!settle(self, idx, tag)) return;
          auto& a = self->state.routes[idx].acked_tick;
          a = std::max(a, hdr.clock);
          chunk_answered(op.get());
        },
        [=](caf::error& err) { request_failed(self, idx, tag, err, op->what); });
  };
  return r;
}

void plane_connect_early(client_ptr self, std::size_t idx);

// A shard the client has not known (it joined): a route to it.
void add_route(client_ptr self, const shard_entry& e, std::uint64_t epoch) {
  auto& st = self->state;
  shard_route r;
  auto where = e.host.empty() ? std::string() : e.host + ":" + std::to_string(e.port) + ", ";
  r.link = {e.id, "shard " + std::to_string(e.id) + " (" + where + "joined at epoch " + std::to_string(epoch) + ")",
            caf::actor_cast<shard_actor>(e.handle)};
  r.entry = e;
  r.tail = r.link.handle;
  add_flow(st, std::move(r));
  auto idx = st.routes.size() - 1;
  st.index[e.id] = idx;
  self->monitor(e.handle);
  plane_connect_early(self, idx);
  if (st.dial && !e.host.empty())
    self->spawn<caf::detached>([dial = st.dial, host = e.host, port = e.port] { dial(host, port); });
  std::lock_guard<std::mutex> lock(st.stats->mtx);
  st.stats->joined.push_back(st.routes[idx].link);
}

// A tick that brings a shard's clock for this worker up to date after a map change (a
// joined shard never had one; one that took keys took the givers' lower clocks too).
// Ticks are idempotent; the fence holds it until the older writes are acknowledged.
void catch_up(client_ptr self, std::size_t idx, std::uint64_t epoch) {
  auto& st = self->state;
  if (st.issued_tick == 0) return;
  auto op = std::make_shared<kv_op_state>();
  op->pending = 1;
  op->what = "clock tick to " + std::to_string(st.issued_tick) + " for " + st.routes[idx].link.name + " after a map change";
  submit(self, idx, clock_request(self, idx, request_header{epoch, st.worker, st.issued_tick, 0}, op));
}

bool reroute_retired(client_ptr self, std::size_t idx);

// A map whose shards differ from the client's (a shard joined): later requests are
// planned by it; reads refused as moved meanwhile are planned again.
void take_new_map(client_ptr self, const cluster_view& view) {
  auto& st = self->state;
  std::shared_ptr<const partitioner> next;
  try {
    next = std::make_shared<const partitioner>(map_of(view));
  } catch (const bad_request& e) {
    log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": a map of epoch " +
                                     std::to_string(view.epoch) + " is malformed (" + e.what() + "); ignored");
    return;
  }
  for (const auto& e : view.shards)
    if (!st.index.count(e.id) && !e.handle) {
      log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": shard " + std::to_string(e.id) +
                                       " joined without a handle; the map of epoch " + std::to_string(view.epoch) +
                                       " is ignored");
      return;
    }
  st.map = next;
  st.core.map_changed(next->epoch());  // raises the fence
  {
    std::lock_guard<std::mutex> lock(st.stats->mtx);
    st.stats->map = next;
  }
  st.stats->changed.notify_all();
  for (const auto& e : view.shards)
    if (!st.index.count(e.id)) add_route(self, e, view.epoch);
  for (std::size_t idx = 0; idx < st.routes.size(); ++idx) {
    const auto id = st.routes[idx].link.id;
    st.routes[idx].retired = std::none_of(view.shards.begin(), view.shards.end(), [&](const shard_entry& e) { return e.id == id; });
    if (!st.routes[idx].retired) catch_up(self, idx, view.epoch);
    else if (st.routes[idx].down.empty() || st.routes[idx].abandoned || !reroute_retired(self, idx)) report_if_idle(self, idx);
  }
  auto parked = std::move(st.moved_reads);
  st.moved_reads.clear();
  for (auto& [batch, reads] : parked)
    for (auto& r : reads) r.replan();
  lift_fence(self);  // at once when no stale write is left
}

bool same_shards(const partitioner& map, const cluster_view& view) {
  if (map.shard_ids().size() != view.shards.size()) return false;
  for (std::size_t i = 0; i < view.shards.size(); ++i)
    if (map.shard_ids()[i] != view.shards[i].id) return false;
  return true;
}

// A new shard map: after a join, the new map (take_new_map); after a failover, shards
// with a new address get every request that was in flight to the old one again, in
// order, behind a tick that brings the new shard's clock for this worker up to date.
void apply_view(client_ptr self, const cluster_view& view) {
  auto& st = self->state;
  st.epoch = std::max(st.epoch, view.epoch);
  if (view.epoch > st.core.map_epoch() && !same_shards(*st.map, view)) take_new_map(self, view);
  for (const auto& e : view.shards) {
    auto at = st.index.find(e.id);
    if (at == st.index.end()) continue;
    auto idx = at->second;
    auto& old = st.routes[idx].entry;
    if (e.since_epoch <= old.since_epoch) continue;  // not newer than what this client has
    auto head = !e.chain.empty() ? e.chain.front() : e.handle;
    auto tail = !e.chain.empty() ? e.chain.back() : head;
    bool moved = head ? head != caf::actor_cast<caf::actor>(st.routes[idx].link.handle) ||
                          tail != caf::actor_cast<caf::actor>(st.routes[idx].tail)
                      : (e.host != old.host || e.port != old.port);
    old.since_epoch = e.since_epoch;
    if (!moved) continue;
    if (!head) {  // a new address we would have to connect to: not produced by this coordinator
      fail_all(self, idx, st.routes[idx].link.name + " moved to " + e.host + ":" + std::to_string(e.port) +
                            ", which this client cannot reach without a handle");
      continue;
    }
    old = e;
    // Learning of the failure from the new map (before its own down message) counts as
    // learning of it: recovery time runs from here then.
    if (!st.routes[idx].down_since) st.routes[idx].down_since = std::chrono::steady_clock::now();
    st.routes[idx].link.handle = caf::actor_cast<shard_actor>(head);
    {
      std::lock_guard<std::mutex> lock(st.stats->mtx);
      st.stats->new_heads[e.id] = st.routes[idx].link.handle;
    }
    st.routes[idx].tail = caf::actor_cast<shard_actor>(tail);
    st.routes[idx].link.name = "shard " + std::to_string(e.id) + " (epoch " + std::to_string(view.epoch) + ")";
    self->monitor(head);
    if (tail != head) self->monitor(tail);
    ++st.routes[idx].generation;
    st.routes[idx].down.clear();
    std::deque<pending_request> again;
    if (st.routes[idx].acked_tick > 0) {
      auto op = std::make_shared<kv_op_state>();
      op->pending = 1;
      op->what = "clock tick to " + std::to_string(st.routes[idx].acked_tick) + " after failover";
      again.push_back(clock_request(self, idx, request_header{0, st.worker, st.routes[idx].acked_tick, 0}, op));
    }
    for (auto& r : take_pending(self, idx)) again.push_back(std::move(r));
    for (auto& r : again) st.core.submit(idx, std::move(r));
    log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": " + st.routes[idx].link.name +
                                     " takes over; " + std::to_string(again.size()) +
                                     " requests sent again");
    pump(self, idx);
  }
  for (std::size_t idx = 0; idx < st.routes.size(); ++idx)
    if (st.routes[idx].retired && !st.routes[idx].down.empty() && !st.routes[idx].abandoned) reroute_retired(self, idx);
}

// A shard that left the map is down (or went down before this client learned it left)
// with requests still waiting for it: they go to a live shard of the new map instead,
// with the same headers, as the leaver would have passed them on. It passes a write's
// parts to their owners (whose duplicate filters count each once, should the leaver have
// passed it on already) and refuses a read as moved, which is planned again by the new
// map; a clock tick for the leaver counts as done (it gates nothing). False when no live
// shard is left.
bool reroute_retired(client_ptr self, std::size_t idx) {
  auto& st = self->state;
  auto live = std::find_if(st.routes.begin(), st.routes.end(), [](const shard_route& r) {
    return !r.retired && r.down.empty() && !r.abandoned;
  });
  if (live == st.routes.end()) return false;
  auto& route = st.routes[idx];
  route.link.handle = live->link.handle;
  route.tail = live->tail;
  self->monitor(route.link.handle);
  if (route.tail != route.link.handle) self->monitor(route.tail);
  ++route.generation;
  route.down.clear();
  for (auto& r : take_pending(self, idx)) {
    if (r.tick) chunk_answered(r.op.get());
    else st.core.submit(idx, std::move(r));
  }
  log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": " + route.link.name + ", which left the map, is down; " +
                                   std::to_string(st.core.at(idx).queued.size()) + " requests sent again through " + live->link.name);
  lift_fence(self);
  pump(self, idx);
  report_if_idle(self, idx);
  return true;
}

// The coordinator or a shard copy went down.
void peer_down(client_ptr self, const caf::down_msg& dm) {
  auto& st = self->state;
  if (st.finished) return;  // the worker has ended: its shards end with the job
  if (st.coordinator && dm.source == st.coordinator.address()) return coordinator_down(self, dm.reason);
  // Its data connection will not come: CAF never fails the question to a dead peer itself.
  if (st.plane_asking.count(dm.source)) plane_peer_settled(self, dm.source, 0);
  for (std::size_t i = 0; i < st.routes.size(); ++i) {
    if (st.routes[i].link.handle.address() != dm.source && st.routes[i].tail.address() != dm.source) continue;
    if (!st.routes[i].down.empty()) continue;  // head and tail of one chain: once is enough
    if (st.routes[i].abandoned) continue;  // the coordinator's word came first and failed it all
    if (st.routes[i].retired) {  // it left the map: no replacement comes, nothing new goes there
      auto why = st.routes[i].link.name + ", which left the map, is down (" + describe(dm.reason) + ")";
      st.routes[i].down = why;
      if (!reroute_retired(self, i)) shard_down(self, i, why);  // until a map names a live shard
      continue;
    }
    // A shard ends normally when its job does: news only for a route that still has work.
    bool job_end = dm.reason == caf::exit_reason::normal && st.core.at(i).idle();
    shard_down(self, i, st.routes[i].link.name + " is down (" + describe(dm.reason) + ")", job_end);
  }
}

// Reads refused as moved (batch) whose new map did not come within the request timeout.
void expire_moved_reads(client_ptr self, std::uint64_t batch) {
  auto it = self->state.moved_reads.find(batch);
  if (it == self->state.moved_reads.end()) return;
  auto reads = std::move(it->second);
  self->state.moved_reads.erase(it);
  for (auto& r : reads)
    r.op->finish(r.op->what + " failed: its keys moved to another shard and no map naming the new owner came within " +
                 std::to_string(self->state.timeout.count()) + " ms");
}

}  // namespace ps::client_internal
