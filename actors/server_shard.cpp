#include "actors/server_shard.hpp"

#include <unistd.h>

#include <cstdio>

namespace ps {

void check_ownership(const partitioner& map, std::uint32_t id, const std::vector<key_range>& ranges) {
  auto bits = map.bucket_bits();
  for (const auto& r : ranges) {
    if (r.empty()) continue;  // the store reports malformed ranges
    for (auto b = r.begin >> bits, last = (r.end - 1) >> bits; b <= last; ++b) {
      auto owner = map.owner_of_bucket(b);
      if (owner != id)
        throw bad_request("keys " + to_string(r) + " belong to shard " + std::to_string(owner) +
                          " (epoch " + std::to_string(map.epoch()) + "), not to this one");
    }
  }
}

shard_actor::behavior_type server_shard(shard_actor::stateful_pointer<shard_state> self,
                                        coordinator_actor coordinator, shard_options opts) {
  self->monitor(coordinator);
  // The job ends when the coordinator goes: nothing else will talk to this shard.
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == coordinator.address()) self->quit(dm.reason);
  });
  // Validates a request and runs `body` on it; bad input becomes an error naming this shard.
  auto checked = [=](const request_header& hdr, const range_list& ranges, auto body) -> caf::error {
    auto& st = self->state;
    if (!st.store)
      return make_ps_error(st.name + ": not configured yet");
    if (hdr.epoch != st.map->epoch())
      return make_ps_error(st.name + ": request from worker " + std::to_string(hdr.worker) +
                           " has epoch " + std::to_string(hdr.epoch) + ", current epoch is " +
                           std::to_string(st.map->epoch()));
    try {
      check_ownership(*st.map, st.id, ranges.ranges);
      body();
    } catch (const bad_request& e) {
      return make_ps_error(st.name + ": " + e.what());
    }
    return {};
  };
  // Replies now, or after opts.reply_delay (test hook simulating a slow shard).
  auto reply = [=](auto value) -> caf::result<decltype(value)> {
    if (opts.reply_delay.count() == 0) return value;
    auto rp = self->template make_response_promise<decltype(value)>();
    self->spawn([=](caf::event_based_actor* timer) mutable -> caf::behavior {
      timer->delayed_send(timer, opts.reply_delay, caf::ok_atom::value);
      return {[=](caf::ok_atom) mutable { rp.deliver(value); timer->quit(); }};
    });
    return rp;
  };
  // push and init differ only in what the store does with the values.
  using write_fn = void (shard_store::*)(const std::vector<key_range>&, const float*, std::uint64_t);
  auto write = [=](write_fn fn, const request_header& hdr, const range_list& ranges,
                   const float_block& values) -> caf::result<std::uint64_t> {
    if (auto err = checked(hdr, ranges, [&] {
          ((*self->state.store).*fn)(ranges.ranges, values.data(), values.size);
        }))
      return err;
    return reply(hdr.seq);
  };
  return {
    [=](push_atom, const request_header& hdr, const range_list& ranges,
        const float_block& values) -> caf::result<std::uint64_t> {
      return write(&shard_store::push, hdr, ranges, values);
    },
    [=](init_atom, const request_header& hdr, const range_list& ranges,
        const float_block& values) -> caf::result<std::uint64_t> {
      return write(&shard_store::init, hdr, ranges, values);
    },
    [=](pull_atom, const request_header& hdr,
        const range_list& ranges) -> caf::result<float_block> {
      std::vector<float> out;
      if (auto err = checked(hdr, ranges, [&] {
            std::uint64_t n = 0;
            for (const auto& r : ranges.ranges) n += r.size();
            out.resize(n);
            self->state.store->pull(ranges.ranges, out.data(), n);
          }))
        return err;
      return reply(float_block::own(std::move(out)));
    },
    [=](start_atom, std::uint16_t port) {
      // Await: no push or pull is handled before the shard knows its map.
      self->request(coordinator, opts.register_timeout, register_atom::value,
                    node_info{"server", opts.host, port, static_cast<std::uint32_t>(getpid()),
                              opts.host.empty() ? caf::actor_cast<caf::actor>(self) : caf::actor{}})
        .await(
          [=](registration& reg) {
            auto& st = self->state;
            st.id = reg.id;
            st.name = "shard " + std::to_string(reg.id);
            std::vector<std::uint32_t> ids;
            for (const auto& s : reg.view.shards) ids.push_back(s.id);
            try {
              st.map.emplace(reg.view.epoch, ids, reg.view.vnodes, reg.view.bucket_bits);
              st.store.emplace(reg.view.rule.to_rule());
            } catch (const bad_request& e) {
              std::fprintf(stderr, "%s: bad cluster configuration: %s\n", st.name.c_str(), e.what());
              self->quit(make_ps_error(e.what()));
            }
          },
          [=](caf::error& err) {
            std::fprintf(stderr, "server: registration with the coordinator failed: %s\n",
                         describe(err).c_str());
            self->quit(err);
          });
    },
  };
}

}  // namespace ps
