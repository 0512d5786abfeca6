// Shards that join a running job and shards that leave it (psctl remove-shard): handoffs,
// drains and the map changes they make.
#include "actors/coordinator/coordinator_internal.hpp"

namespace ps::coordinator_internal {

// The answer (or failure, why) to ask `attempt` of shard id's handoff in round r; one
// asked again since is no longer waited for.
void handoff_answered(self_ptr self, const std::shared_ptr<handover_round>& r, std::uint32_t id, std::uint64_t attempt,
                      const std::string& why) {
  auto it = r->pending.find(id);
  if (it == r->pending.end() || it->second != attempt) return;
  r->pending.erase(it);
  if (!why.empty()) r->failed = "shard " + std::to_string(id) + ": " + why;
  if (!r->pending.empty()) return;
  if (self->state.handover == r) self->state.handover.reset();
  r->done(r->failed);
}

// Asks shard id's head of the moment for its part of round r: the change's map, with the
// heads and chains as they are now (a chain may have closed since the change began).
void ask_for_handoff(self_ptr self, const coordinator_options& opts, const std::shared_ptr<handover_round>& r,
                     std::uint32_t id) {
  auto& st = self->state;
  auto attempt = ++r->pending[id];
  auto view = make_view(self, opts);
  view.epoch = r->epoch;
  auto head = st.shard_handles[id];
  self->request(head, std::chrono::seconds(120), handoff_atom::value, view)
    .then([=](std::uint64_t) { handoff_answered(self, r, id, attempt, ""); },
          [=](caf::error& e) {
            // A head that died: with chains it is asked again once its chain has closed
            // (copy_failed, or now if that came first).
            if (opts.replication >= 2 && e == caf::sec::request_receiver_down) {
              if (self->state.shard_handles[id] != head && r->pending.count(id) && r->pending[id] == attempt)
                ask_for_handoff(self, opts, r, id);
              return;
            }
            handoff_answered(self, r, id, attempt, describe(e));
          });
}

// The shards `ids` hand over what the change's map (view) moves; done(why) once all
// answered (why: empty when every one could).
void hand_over(self_ptr self, const coordinator_options& opts, const std::vector<std::uint32_t>& ids,
               const cluster_view& view, std::function<void(std::string)> done) {
  if (ids.empty()) return done("");
  auto r = std::make_shared<handover_round>();
  r->epoch = view.epoch;
  r->done = std::move(done);
  self->state.handover = r;
  for (auto id : ids) ask_for_handoff(self, opts, r, id);
}

// A chain closed during a map change: a head that had not answered its handoff yet is
// asked again through the new head.
void ask_again_after_failover(self_ptr self, const coordinator_options& opts, std::uint32_t id) {
  auto r = self->state.handover;
  if (r && r->pending.count(id)) ask_for_handoff(self, opts, r, id);
}

// A fraction with three decimals, for news.
std::string fraction_text(double f) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", f);
  return text;
}

// Milliseconds since `start`, for news.
// A map change begins: saved with the new map, so a coordinator resumed before it ends
// finishes it (finish_change).
void begin_change(self_ptr self, const coordinator_options& opts, const std::string& kind, std::uint32_t shard) {
  auto& st = self->state;
  st.joining = true;
  st.change = kind;
  st.change_shard = shard;
  st.change_epoch = st.epoch;
  persist(self, opts);
}

// The map change is over (its map is saved with the announcement that follows).
void end_change(self_ptr self) {
  self->state.joining = false;
  self->state.change.clear();
}

// Why the map cannot change now (empty: it can), and whether that passes (errc::busy: the
// same change may be asked again later) or not (errc::refused).
std::pair<errc, std::string> map_change_refusal(const coordinator_state& st) {
  if (st.core.resuming()) return {errc::busy, "the coordinator is resuming the job; try again once its members are back"};
  if (st.joining || st.after_growth) return {errc::busy, "another shard is joining or leaving; try again once it has"};
  if (st.core.ending()) return {errc::refused, "the job is ending"};
  if (!st.core.chains_complete()) return {errc::refused, "the job has not formed yet"};
  return {errc::refused, {}};
}

// Before a map change: every shard must answer (a shard that cannot would leave its part
// of the handoffs undone). go() once each answered, else refused(why). The map change
// is reserved meanwhile (another is refused). With chains, a head that died is asked
// again through its chain's new head, once the chain has closed (copy_failed).
void when_shards_can_move(self_ptr self, const coordinator_options& opts, std::function<void()> go,
                          std::function<void(std::string)> refused) {
  if (self->state.growing) {  // a copy seeded under the old map must not join its chain under the new one
    self->state.after_growth = [=] { when_shards_can_move(self, opts, go, refused); };
    return;
  }
  auto heads = live_heads(self->state);
  self->state.joining = true;
  auto dead = std::make_shared<std::vector<shard_actor>>();  // heads that bounced the question
  auto settle = [=](std::string why) {
    auto& st = self->state;
    st.joining = false;
    if (why.empty()) return go();
    auto again = [=] { when_shards_can_move(self, opts, go, refused); };
    if (opts.replication >= 2 && !dead->empty()) {
      const auto live = live_heads(st);
      bool replaced = std::none_of(dead->begin(), dead->end(), [&](const shard_actor& h) {
        return std::find(live.begin(), live.end(), h) != live.end();
      });
      st.joining = true;  // still reserved
      if (replaced) return again();
      st.retry_move = again;  // once the chain closed over it
      return;
    }
    grow_chains(self, opts);  // over copies that died meanwhile
    refused(why);
  };
  auto remaining = std::make_shared<std::size_t>(heads.size());
  auto failed = std::make_shared<std::string>();
  if (heads.empty()) return settle("");
  for (std::size_t i = 0; i < heads.size(); ++i)
    self->request(heads[i], std::chrono::seconds(5), min_clock_atom::value)  // the cheapest question
      .then([=](std::uint64_t) {
              if (--*remaining == 0) settle(*failed);
            },
            [=](caf::error& e) {
              *failed = "a shard did not answer before the map change (" + describe(e) + ")";
              if (e == caf::sec::request_receiver_down) dead->push_back(heads[i]);
              if (--*remaining == 0) settle(*failed);
            });
}

// With chains of copies, a joiner's chain is built before anything moves to it: copies in
// other processes seeded by it (it holds nothing yet), as chains grow back; then(). When
// no process can host another copy (or one refused), it goes on with the copies it has.
void build_joiner_chain(self_ptr self, const coordinator_options& opts, std::uint32_t id, std::function<void()> then) {
  auto& st = self->state;
  const auto& chain = st.shards[id].chain;
  if (opts.replication < 2 || chain.empty() || chain.size() >= opts.replication) return then();
  auto host = st.ungrowable.count(id) ? std::nullopt : host_for_copy(opts, st, id);
  if (!host) {
    tell_news(opts, "server shard " + std::to_string(id) + " joins with " + std::to_string(chain.size()) + " of " +
                      std::to_string(opts.replication) + " copies: no other live server process can hold one");
    return then();
  }
  grow_chain(self, opts, id, *host, [=] { build_joiner_chain(self, opts, id, then); });
}

// The joiner has the map (and, with chains, its copies): the givers hand it what the map
// moves; the clients get the map once it has all of it.
void hand_to_joiner(self_ptr self, const coordinator_options& opts, const std::string& who,
                    std::vector<std::uint32_t> givers, cluster_view view, double moved) {
  auto started = std::chrono::steady_clock::now();
  hand_over(self, opts, givers, view, [=](std::string failed) {
    if (!failed.empty()) return end_job(self, opts, errc::job_failed, who + " could not join: " + failed);
    end_change(self);
    tell_news(opts, "coordinator: " + who + " joined; its keys and rows were handed over in " + ms_since(started) +
                      " ms (" + fraction_text(moved) + " of the dense keys moved); epoch " + std::to_string(view.epoch) +
                      ", " + std::to_string(self->state.shards.size() - self->state.retired.size()) + " shards now");
    announce_view(self, opts);
    grow_chains(self, opts);  // over copies that died while it joined
  });
}

// A server registers while the job runs: it joins as a new shard. The ring gives it
// about 1/(n+1) of the keys and rows; it gets its registration (the new map) first, then
// the old shards hand it what moved, and only then do the clients learn the map.
// The join itself: the new map, the newcomer's registration (rp), then the handoffs.
void admit_shard(self_ptr self, const coordinator_options& opts, const caf::actor& sender, const node_info& info,
                 caf::typed_response_promise<registration> rp) {
  auto& st = self->state;
  partitioner next = map_of(make_view(self, opts));
  auto id = static_cast<std::uint32_t>(st.shards.size());
  try {
    next = next.with_shard(id);
  } catch (const bad_request& e) {
    rp.deliver(make_error(errc::refused, std::string("coordinator: a server cannot join this job: ") + e.what()));
    return;
  }
  auto givers = live_ids(st);
  auto old_placement = st.placement;
  auto moved = moved_key_fraction(map_of(make_view(self, opts)), next, dense_ranges(opts.spec));
  st.epoch = next.epoch();
  st.placement = next.placement();
  st.shards.push_back({id, info.host, info.port, info.pid, sender, {}, st.epoch});
  if (opts.replication >= 2) st.shards.back().chain = {sender};
  auto shard = caf::actor_cast<shard_actor>(sender);
  st.shard_handles.push_back(shard);
  st.process_heads[id] = shard;
  st.copies.push_back(shard);
  st.shard_ids[sender.address()] = id;
  self->monitor(sender);
  auto who = "server shard " + std::to_string(id) +
             (info.host.empty() ? "" : " (" + info.host + ":" + std::to_string(info.port) + ", pid " +
                                         std::to_string(info.pid) + ")");
  st.members[sender.address()] = who + " (joined)";
  begin_change(self, opts, "join", id);
  auto view = make_view(self, opts);
  tell_checkpointer(opts, view);  // before any shard takes parts under the new map
  tell_map_change(opts, true);
  rp.deliver(make_registration(self, opts, id));
  // Behind its registration (one sender, one order): once it has the map, the handoffs.
  self->request(shard, std::chrono::seconds(10), view_atom::value, view)
    .then([=](std::uint64_t) {
            build_joiner_chain(self, opts, id, [=] { hand_to_joiner(self, opts, who, givers, view, moved); });
          },
          [=](caf::error& e) {  // nothing moved yet: the job goes on without it
            auto& st = self->state;
            end_change(self);
            st.retired.insert(id);
            st.process_heads.erase(id);
            st.placement = old_placement;
            st.copies.erase(std::remove(st.copies.begin(), st.copies.end(), shard), st.copies.end());
            st.shard_ids.erase(shard.address());
            st.members.erase(shard.address());
            tell_map_change(opts, false);
            tell_news(opts, "coordinator: " + who + " did not take the map (" + describe(e) + "); the job goes on without it");
            persist(self, opts);
          });
}


caf::result<registration> join_shard(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                     const node_info& info) {
  auto refuse = [](const std::string& why, errc code = errc::refused) {
    return make_error(code, "coordinator: a server cannot join this job: " + why);
  };
  if (auto [code, why] = map_change_refusal(self->state); !why.empty()) return refuse(why, code);
  if (!sender) return refuse("the registration came without a handle");
  auto rp = self->make_response_promise<registration>();
  when_shards_can_move(
    self, opts, [=]() mutable { admit_shard(self, opts, sender, info, rp); },
    [=](std::string why) mutable { rp.deliver(refuse(why)); });
  return rp;
}


// Why a leaver's process must not end yet (nullopt: it may): it holds a copy of another
// shard whose chain would be left short of --replication, and another process can take
// one (that chain grows there first; chain_grown asks again).
std::optional<std::string> rehoming_needed(const coordinator_options& opts, const coordinator_state& st,
                                           std::uint32_t process) {
  if (opts.replication < 2) return std::nullopt;
  for (std::uint32_t other = 0; other < st.shards.size(); ++other) {
    if (other != process && can_grow(opts, st, other) && copies_in_process(opts, st, other, process) > 0)
      return "its process holds a copy of shard " + std::to_string(other) + ", whose chain grows elsewhere first";
  }
  return std::nullopt;
}

// A shard that left the map stops once no running worker's client needs it (each says
// so, or finishes): normally, so its process exits 0. Not while its process holds a copy
// another process should take first (rehoming_needed).
void stop_if_drained(self_ptr self, const coordinator_options& opts, std::uint32_t id) {
  auto& st = self->state;
  auto it = st.draining_clients.find(id);
  if (it == st.draining_clients.end() || !it->second.empty()) return;
  auto why = last_copy_in_process(opts, st, id);  // kept however long it takes: else the keys are lost
  if (!why) why = rehoming_needed(opts, st, id);
  if (why) {
    if (st.leavers_held.insert(id).second)
      tell_news(opts, "coordinator: shard " + std::to_string(id) + " has left but does not stop yet: " + *why);
    return grow_chains(self, opts);
  }
  st.leavers_held.erase(id);
  st.draining_clients.erase(it);
  stop_leavers_copies(self, id);
  self->request(st.shard_handles[id], std::chrono::seconds(5), stop_atom::value, std::uint8_t{0},
                std::string("removed from the job (psctl remove-shard)"))
    .then([](caf::ok_atom) {}, [](caf::error&) {});
}

// psctl remove-shard: the remaining shards take the new map first (they gain the
// leaver's keys and rows), then the leaver hands everything over; then the map goes out.

// The copies a server process holds end with it (ends_with): why it cannot end when one
// of them is the last of its shard (nullopt: it can).
std::optional<std::string> last_copy_in_process(const coordinator_options& opts, const coordinator_state& st,
                                                std::uint32_t process) {
  if (opts.replication < 2) return std::nullopt;
  for (std::uint32_t other = 0; other < st.shards.size(); ++other) {
    if (other == process || st.retired.count(other)) continue;
    const auto here = copies_in_process(opts, st, other, process);
    if (here > 0 && here == st.shards[other].chain.size())
      return "its process holds the last copy of shard " + std::to_string(other) +
             " (the other copies died); add a server or wait until that chain grew back";
  }
  return std::nullopt;
}

// Why shard id cannot leave because of the copies its process holds (nullopt: it can);
// a process whose first shard is no longer that shard's head has ended.
std::optional<std::string> leaver_holds_last_copy(const coordinator_options& opts, const coordinator_state& st,
                                                  std::uint32_t id) {
  auto head = st.process_heads.find(id);
  if (head == st.process_heads.end() || head->second != st.shard_handles[id]) return std::nullopt;
  return last_copy_in_process(opts, st, id);
}

caf::result<std::string> remove_shard(self_ptr self, const coordinator_options& opts, std::uint32_t id) {
  auto& st = self->state;
  auto refuse = [id](const std::string& why, errc code = errc::refused) {  // by value: it may answer after this handler
    return make_error(code, "coordinator: shard " + std::to_string(id) + " cannot leave: " + why);
  };
  if (auto [code, why] = map_change_refusal(st); !why.empty()) return refuse(why, code);
  if (id >= st.shards.size() || st.retired.count(id)) return refuse("there is no such shard in the map");
  if (st.shards.size() - st.retired.size() < 2) return refuse("it is the last shard");
  if (auto last = leaver_holds_last_copy(opts, st, id)) return refuse(*last);
  auto rp = self->make_response_promise<std::string>();
  when_shards_can_move(
    self, opts, [=]() mutable { drain_shard(self, opts, id, rp); }, [=](std::string why) mutable { rp.deliver(refuse(why)); });
  return rp;
}

// A copy leaves the membership: its end is no failure, and it gets no more news.
void forget_copy(coordinator_state& st, const caf::actor_addr& copy) {
  st.copies.erase(std::remove_if(st.copies.begin(), st.copies.end(), [&](const shard_actor& c) { return c.address() == copy; }),
                  st.copies.end());
  st.shard_ids.erase(copy);
  st.copy_positions.erase(copy);
  st.members.erase(copy);
}

// The copies further down a leaver's chain hold nothing the map gives them (they dropped
// it as the leaver handed it over): they stop with it, once the clients drained it.
void stop_leavers_copies(self_ptr self, std::uint32_t id) {
  auto& st = self->state;
  for (const auto& copy : st.leavers_copies[id])
    self->request(caf::actor_cast<shard_actor>(copy), std::chrono::seconds(5), stop_atom::value, std::uint8_t{0},
                  std::string("its shard left the job (psctl remove-shard)"))
      .then([](caf::ok_atom) {}, [](caf::error&) {});
  st.leavers_copies.erase(id);
}

// A leaver has handed everything over: it leaves the membership (its end is no failure,
// and it gets no more news) and stops once no running worker's client needs it.
void let_leaver_go(self_ptr self, std::uint32_t id) {
  auto& st = self->state;
  end_change(self);
  auto leaver = st.shard_handles[id];
  auto& chain = st.shards[id].chain;
  for (std::size_t i = 1; i < chain.size(); ++i) {
    forget_copy(st, chain[i].address());
    st.leavers_copies[id].push_back(chain[i]);
  }
  if (chain.size() > 1) chain.resize(1);
  forget_copy(st, leaver.address());
  if (auto p = st.process_heads.find(id); p != st.process_heads.end() && p->second == leaver)
    st.process_heads.erase(p);  // its process ends with it: it hosts no copy from now on
  auto& waiting = st.draining_clients[id];
  for (const auto& [addr, worker] : st.subscriber_workers)
    if (st.core.worker_running(worker)) waiting.insert(worker);
}

// The removal itself (remove_shard checked it can be done): answered through rp.
void drain_shard(self_ptr self, const coordinator_options& opts, std::uint32_t id,
                 caf::typed_response_promise<std::string> rp) {
  auto& st = self->state;
  auto before = map_of(make_view(self, opts));
  partitioner next = before.without_shard(id);
  auto moved = moved_key_fraction(before, next, dense_ranges(opts.spec));
  st.epoch = next.epoch();
  st.placement = next.placement();
  st.retired.insert(id);
  begin_change(self, opts, "leave", id);
  auto remaining_shards = live_ids(st);
  auto view = make_view(self, opts);
  tell_checkpointer(opts, view);  // before any shard takes parts under the new map
  tell_map_change(opts, true);
  auto started = std::chrono::steady_clock::now();
  auto who = "shard " + std::to_string(id);
  auto failed = [=](const std::string& why) mutable {
    end_change(self);
    rp.deliver(make_ps_error("coordinator: " + who + " could not leave: " + why));
    end_job(self, opts, errc::job_failed, who + " could not leave: " + why);
  };
  hand_over(self, opts, remaining_shards, view, [=](std::string why) mutable {
    if (!why.empty()) return failed(why);
    hand_over(self, opts, {id}, view, [=](std::string why) mutable {
      if (!why.empty()) return failed(why);
      auto& st = self->state;
      let_leaver_go(self, id);
      auto text = who + " left; its keys and rows were handed over in " + ms_since(started) + " ms (" +
                  fraction_text(moved) + " of the dense keys moved); epoch " +
                  std::to_string(view.epoch) + ", " + std::to_string(st.shards.size() - st.retired.size()) +
                  " shards now";
      tell_news(opts, "coordinator: " + text);
      announce_view(self, opts, [=]() mutable {
        rp.deliver(text);
        stop_if_drained(self, opts, id);
      });
      grow_chains(self, opts);  // over copies that died while it left
    });
  });
}

}  // namespace ps::coordinator_internal
