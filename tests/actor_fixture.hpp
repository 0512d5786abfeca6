#pragma once
// Shared by the actor protocol tests: CAF's deterministic test coordinator (docs/testing.md),
// where every message is delivered by sched.run() and timeouts fire when the test
// advances the clock.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include <memory>
#include <optional>

#include "actors/coordinator.hpp"
#include "actors/kv_client.hpp"
#include "actors/server_shard.hpp"
#include "actors/transport/memory.hpp"

namespace ps::test {

using std::chrono::milliseconds;

// Collects every message an actor receives (including down messages).
struct inbox {
  std::vector<caf::message> messages;
  template <class... Ts>
  std::size_t count() const {
    std::size_t n = 0;
    for (const auto& m : messages) n += m.match_elements<Ts...>() ? 1 : 0;
    return n;
  }
};

struct fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scheduler::test_coordinator& sched;

  std::vector<caf::actor> alive;  // helpers kept referenced (unreferenced actors end)

  fixture()
      : sys(init(cfg)),
        sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {}

  // Everything still running must end before the actor system can: deliver the exits.
  ~fixture() {
    for (auto& a : alive) caf::anon_send_exit(a, caf::exit_reason::kill);
    sched.run();
  }

  static caf::actor_system_config& init(caf::actor_system_config& c) {
    register_types(c);
    c.set("scheduler.policy", caf::atom("testing"));
    return c;
  }

  // An actor that stores everything it receives in `box`.
  caf::actor spawn_inbox(std::shared_ptr<inbox> box) {
    return sys.spawn([box](caf::event_based_actor* self) -> caf::behavior {
      self->set_default_handler([box](caf::scheduled_actor*, caf::message_view& mv) -> caf::result<caf::message> {
        box->messages.push_back(mv.move_content_to_message());
        return caf::message{};
      });
      self->set_down_handler([box](caf::down_msg& dm) { box->messages.push_back(caf::make_message(dm)); });
      return {[](caf::unit_t) {}};
    });
  }

  // Registers as a worker from a helper actor that stays alive (the coordinator
  // monitors it: its end would mean the worker left); returns where the reply lands.
  std::shared_ptr<std::optional<registration>> register_worker(coordinator_actor coord) {
    auto slot = std::make_shared<std::optional<registration>>();
    alive.push_back(sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
      self->request(coord, caf::infinite, register_atom::value, node_info{"worker", "", 0, 0, {}, 0, 0, protocol_version, {}})
        .then([=](registration& r) { *slot = r; });
      return {[](caf::unit_t) {}};
    }));
    return slot;
  }

  // Runs the scheduler until idle; the op must be complete then (never blocks).
  std::vector<float> settle(kv_future f) {
    sched.run();
    REQUIRE(f.ready());
    return f.get();
  }

  coordinator_actor spawn_coordinator(std::uint32_t servers, std::uint32_t workers, caf::actor observer = {}) {
    coordinator_options o;
    o.servers = servers;
    o.workers = workers;
    o.observer = caf::actor_cast<observer_actor>(observer);
    return spawn_coordinator(o);
  }

  coordinator_actor spawn_coordinator(const coordinator_options& o) {
    auto c = sys.spawn(coordinator, o);
    alive.push_back(caf::actor_cast<caf::actor>(c));
    return c;
  }

  shard_actor spawn_shard(coordinator_actor coord, shard_options opts = {}) {
    auto s = sys.spawn(server_shard, coord, opts);
    caf::anon_send(s, start_atom::value, std::uint16_t{0});
    alive.push_back(caf::actor_cast<caf::actor>(s));
    return s;
  }

  // A coordinator, `shards` shards and one worker registered: shard 0's handle and the
  // worker's registration.
  std::pair<shard_actor, registration> shards_and_one_worker(std::uint32_t shards) {
    auto coord = spawn_coordinator(shards, 1);
    auto first = spawn_shard(coord);
    for (std::uint32_t i = 1; i < shards; ++i) spawn_shard(coord);
    auto reg = register_worker(coord);
    sched.run();
    REQUIRE(reg->has_value());
    return {first, **reg};
  }
  std::pair<shard_actor, registration> two_shards_one_worker() { return shards_and_one_worker(2); }

  // A member of this fixture's in-memory transport: every block of one float or more goes
  // named in its message and over the transport, as production's data plane carries them.
  std::shared_ptr<transport> plane_member() {
    static std::atomic<std::uint64_t> fixtures{0};
    if (fabric.empty()) fabric = "fixture-" + std::to_string(fixtures++);
    transport_settings s;
    s.bind_host = s.advertised_host = fabric;
    s.min_bytes = sizeof(float);
    return make_memory_transport(s);
  }
  std::string fabric;

  static std::vector<shard_link> links_of(const cluster_view& view) {
    std::vector<shard_link> links;
    for (const auto& s : view.shards)
      links.push_back({s.id, "shard " + std::to_string(s.id), caf::actor_cast<shard_actor>(s.handle)});
    return links;
  }
};

// Two shards (2 x 32 keys in 4-key buckets), a coordinator and `workers` kv_clients on the
// test scheduler, the keys initialized to 0. Blocks go over the in-memory transport (each
// shard and client a member of its own) unless a test sets over_plane to false.
struct two_shard_cluster : fixture {
  static constexpr std::uint64_t num_keys = 64;
  coordinator_actor coord;
  std::vector<shard_actor> shards;                  // the heads
  std::vector<std::unique_ptr<kv_client>> clients;  // by worker id
  cluster_view view;                                // as the workers got it
  bool over_plane = true;
  key_set keys = key_set::single({0, num_keys});

  // follow_failovers: the clients hear of new maps from the coordinator.
  void start(coordinator_options o, std::uint32_t workers, shard_options sopts = {}, bool follow_failovers = false) {
    o.servers = 2;
    o.workers = workers;
    o.bucket_bits = 2;
    coord = spawn_coordinator(o);
    for (int i = 0; i < 2; ++i) {
      if (over_plane) sopts.plane = plane_member();
      shards.push_back(spawn_shard(coord, sopts));
    }
    std::vector<std::shared_ptr<std::optional<registration>>> regs;
    for (std::uint32_t w = 0; w < workers; ++w) regs.push_back(register_worker(coord));
    sched.run();
    clients.resize(workers);
    for (auto& r : regs) {
      REQUIRE(r->has_value());
      view = (*r)->view;
      kv_client_options opts{(*r)->id, default_chunk_bytes, milliseconds(60000)};
      if (follow_failovers) opts.coordinator = coord;
      if (over_plane) opts.plane = plane_member();
      clients[(*r)->id] = std::make_unique<kv_client>(sys, view, links_of(view), opts);
    }
    auto init = clients[0]->init(keys, std::vector<float>(num_keys, 0.0f));
    sched.run();
    REQUIRE(init.error() == "");
  }
};

}  // namespace ps::test
