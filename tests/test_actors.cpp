// Actor protocol tests on CAF's deterministic test coordinator (docs/testing.md): every
// message is delivered by sched.run(), timeouts fire when the test advances the clock.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <caf/all.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <thread>

#include "actors/checkpointer.hpp"
#include "actors/row_io.hpp"
#include "actors/data_plane.hpp"
#include "tests/actor_fixture.hpp"
#include "tests/scratch_dir.hpp"

using namespace ps;
using namespace ps::test;

TEST_CASE_FIXTURE(fixture, "workers get the shard map only once every server has registered") {
  auto coord = spawn_coordinator(2, 1);
  spawn_shard(coord);
  auto reg = register_worker(coord);
  sched.run();
  CHECK_FALSE(reg->has_value());  // one of two servers: parked
  spawn_shard(coord);
  sched.run();
  REQUIRE(reg->has_value());
  const auto& view = (*reg)->view;
  CHECK(view.shards.size() == 2);
  CHECK(view.shards[0].id == 0);
  CHECK(view.shards[1].id == 1);
  CHECK(view.shards[0].handle);
  CHECK(view.num_workers == 1);
}

TEST_CASE_FIXTURE(fixture, "push and pull through the kv client, chunked across two shards") {
  auto [shard, reg] = two_shards_one_worker();
  kv_client kv(sys, reg.view, links_of(reg.view), {0, 1024, milliseconds(1000)});
  const std::uint64_t n = 20000;  // 80 KB over 1 KiB chunks: ~80 messages per op
  auto keys = key_set::single({100, 100 + n});
  std::vector<float> ones(n, 1.0f), twos(n, 2.0f);
  auto p1 = kv.push(keys, ones);
  auto shared_twos = std::make_shared<std::vector<float>>(twos);
  auto p2 = kv.push(keys, shared_twos);  // shared buffer: sent without a copy
  CHECK_THROWS_WITH_AS(kv.push(keys, std::shared_ptr<std::vector<float>>{}), doctest::Contains("null buffer"),
                       bad_request);
  CHECK_FALSE(p1.ready());  // nothing runs until the scheduler does
  sched.run();
  REQUIRE(p1.ready());
  REQUIRE(p2.ready());
  CHECK(p1.error() == "");
  auto values = settle(kv.pull(keys));
  REQUIRE(values.size() == n);
  for (auto v : values) REQUIRE(v == 3.0f);
  CHECK(*shared_twos == twos);  // the caller's buffer is untouched
  // Into the caller's buffer, handed back filled: its memory is reused, for answers of
  // many chunks and of one, whatever it held and however large it was.
  std::vector<float> buffer(n, -1.0f);
  const float* memory = buffer.data();
  buffer = settle(kv.pull(keys, std::move(buffer)));
  CHECK(buffer.data() == memory);
  REQUIRE(buffer.size() == n);
  CHECK(std::count(buffer.begin(), buffer.end(), 3.0f) == static_cast<std::ptrdiff_t>(n));
  buffer = settle(kv.pull(key_set::single({100, 110}), std::move(buffer)));
  CHECK(buffer.data() == memory);
  CHECK(buffer == std::vector<float>(10, 3.0f));
  CHECK(settle(kv.pull(key_set::single({100, 103}), {})) == std::vector<float>(3, 3.0f));
  // Both shards hold part of the keys.
  std::set<std::uint32_t> owners;
  for (auto k = keys.ranges()[0].begin; k < keys.ranges()[0].end; k += 4096) owners.insert(kv.map().owner(k));
  CHECK(owners.size() == 2);
}

TEST_CASE_FIXTURE(fixture, "pushes go in push-sized chunks, pulls in chunk-sized ones") {
  auto [shard, reg] = shards_and_one_worker(1);
  kv_client_options opts{0, 16384, milliseconds(1000)};
  opts.push_chunk_bytes = 4096;
  CHECK(opts.chunk_bytes_of(op_kind::push) == 4096);
  CHECK(opts.chunk_bytes_of(op_kind::init) == 4096);
  CHECK(opts.chunk_bytes_of(op_kind::pull) == 16384);
  kv_client kv(sys, reg.view, links_of(reg.view), opts);
  const std::uint64_t n = 10000;  // 40,000 bytes: 10 push chunks of <= 4 KiB, 3 pull chunks of <= 16 KiB
  auto keys = key_set::single({0, n});
  settle(kv.push(keys, std::vector<float>(n, 2.0f)));
  auto values = settle(kv.pull(keys));
  CHECK(values == std::vector<float>(n, 2.0f));
  auto stats = std::make_shared<std::string>();
  alive.push_back(sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    self->request(shard, caf::infinite, stats_atom::value).then([=](std::string& s) { *stats = s; });
    return {[](caf::unit_t) {}};
  }));
  sched.run();
  auto counts = nlohmann::json::parse(*stats);
  CHECK(counts["pushes"] == 10);
  CHECK(counts["pulls"] == 3);
  // Never larger than --ps.chunk-bytes: a push chunk above it is cut at it.
  opts.push_chunk_bytes = 1u << 20;
  CHECK(opts.chunk_bytes_of(op_kind::push) == 16384);
}

TEST_CASE_FIXTURE(fixture, "bad requests get errors naming the shard and the problem") {
  auto coord = spawn_coordinator(1, 1);
  auto shard = spawn_shard(coord);
  auto reg = register_worker(coord);
  sched.run();
  REQUIRE(reg->has_value());
  kv_client kv(sys, (*reg)->view, links_of((*reg)->view), {0, default_chunk_bytes, milliseconds(1000)});
  CHECK_THROWS_WITH_AS(settle(kv.pull(key_set::single({5, 9}))), doctest::Contains("shard 0: keys [5, 9) were never pushed"), kv_error);
  CHECK_THROWS_WITH_AS(kv.push(key_set::single({0, 4}), {1, 2, 3}), doctest::Contains("3 values for 4 keys"),
                       bad_request);
  // A request with a stale epoch is refused, never applied.
  auto box = std::make_shared<inbox>();
  auto probe = sys.spawn([=](caf::event_based_actor* self) {
    self->request(shard, caf::infinite, push_atom::value, request_header{7, 0, 0, 1}, range_list{{{0, 1}}},
                  float_block::own({1.0f}))
      .then([=](std::uint64_t) { box->messages.push_back(caf::make_message(std::string("applied"))); },
            [=](caf::error& e) { box->messages.push_back(caf::make_message(describe(e))); });
  });
  sched.run();
  REQUIRE(box->messages.size() == 1);
  CHECK(box->messages[0].get_as<std::string>(0).find("epoch 7, current epoch is 1") != std::string::npos);
  // A size mismatch sent around the client is refused by the shard too.
  auto box2 = std::make_shared<inbox>();
  sys.spawn([=](caf::event_based_actor* self) {
    self->request(shard, caf::infinite, push_atom::value, request_header{1, 0, 0, 1}, range_list{{{0, 3}}},
                  float_block::own({1.0f}))
      .then([=](std::uint64_t) {}, [=](caf::error& e) { box2->messages.push_back(caf::make_message(describe(e))); });
  });
  sched.run();
  REQUIRE(box2->messages.size() == 1);
  CHECK(box2->messages[0].get_as<std::string>(0).find("1 values for 3 keys") != std::string::npos);
}

namespace {

// A shard that accepts requests and never answers (a hung peer), but for the pulls it
// was given answers for.
struct silent_state {
  std::vector<caf::response_promise> held;
  std::deque<float_block> pull_answers;
  std::size_t pulls = 0;
  std::size_t pushes = 0;
};
shard_actor::behavior_type silent_shard(shard_actor::stateful_pointer<silent_state> self) {
  auto hold = [=] {
    self->state.held.push_back(self->make_response_promise());
  };
  return {
    [=](push_atom, const request_header&, const range_list&, const float_block&) -> caf::result<std::uint64_t> {
      ++self->state.pushes;
      hold();
      return caf::delegated<std::uint64_t>();
    },
    [=](push_atom, const request_header&, const range_list&, const encoded_block&) -> caf::result<std::uint64_t> {
      hold();
      return caf::delegated<std::uint64_t>();
    },
    [=](init_atom, const request_header&, const range_list&, const float_block&) -> caf::result<std::uint64_t> {
      hold();
      return caf::delegated<std::uint64_t>();
    },
    [=](pull_atom, const request_header&, const range_list&) -> caf::result<float_block> {
      ++self->state.pulls;
      if (auto& answers = self->state.pull_answers; !answers.empty()) {
        auto answer = std::move(answers.front());
        answers.pop_front();
        return answer;
      }
      hold();
      return caf::delegated<float_block>();
    },
    [=](push_rows_atom, const request_header&, const row_ids&, const float_block&) -> caf::result<std::uint64_t> {
      hold();
      return caf::delegated<std::uint64_t>();
    },
    [=](pull_rows_atom, const request_header&, const row_ids&) -> caf::result<float_block> {
      hold();
      return caf::delegated<float_block>();
    },
    [=](data_atom) -> caf::result<std::string, std::uint16_t, std::uint64_t> {
      hold();
      return caf::delegated<std::string, std::uint16_t, std::uint64_t>();
    },
    [=](clock_atom, const request_header&) -> caf::result<std::uint64_t> {
      hold();
      return caf::delegated<std::uint64_t>();
    },
    [=](leave_atom, std::uint32_t) {},
    [=](join_atom, std::uint32_t) { return std::uint64_t{0}; },
    [=](restore_atom, const registration&, std::uint64_t, const std::vector<std::uint32_t>&, const std::string&) {
      return caf::actor{};
    },
    [=](min_clock_atom) { return std::uint64_t{0}; },
    [=](stats_atom) { return std::string{"{}"}; },
    [=](prefetch_atom, const request_header&, const row_ids&) {},
    [=](fill_atom, std::uint32_t, std::uint64_t) { return std::uint64_t{0}; },
    [=](cut_atom, std::uint64_t) { return std::uint64_t{0}; },
    [=](final_atom) { return std::uint64_t{0}; },
    [=](final_atom, std::uint64_t) {},
    [=](view_atom, const cluster_view& v) { return v.epoch; },
    [=](handoff_atom, const cluster_view& v) { return v.epoch; },
    [=](takeover_atom, const encoded_block&) { return std::uint64_t{0}; },
    [=](host_copy_atom, const registration&, std::uint32_t) { return caf::actor{}; },
    [=](extend_atom, const caf::actor&) { return std::uint64_t{0}; },
    [=](sweep_atom) {},
    [=](start_atom, std::uint16_t) {},
    [=](rejoin_atom, const caf::actor&) {},
    [=](rejoin_atom, const std::string&) {},
    [=](stop_atom, std::uint8_t, const std::string&) { return caf::ok_atom::value; },
  };
}

cluster_view one_shard_view(shard_actor s) {
  cluster_view v;
  v.vnodes = 16;
  v.bucket_bits = 12;
  v.num_workers = 1;
  v.shards.push_back({0, "", 0, 0, caf::actor_cast<caf::actor>(s), {}});
  return v;
}

}  // namespace

TEST_CASE_FIXTURE(fixture, "a silent shard fails the request at its timeout, naming shard and keys") {
  auto s = sys.spawn(silent_shard);
  auto view = one_shard_view(s);
  kv_client kv(sys, view, {{0, "shard 0 (test)", s}}, {0, default_chunk_bytes, milliseconds(2500)});
  auto f = kv.pull(key_set::single({0, 10}));
  sched.run();
  CHECK_FALSE(f.ready());
  sched.clock().advance_time(milliseconds(2499));
  sched.run();
  CHECK_FALSE(f.ready());
  sched.clock().advance_time(milliseconds(2));
  sched.run();
  REQUIRE(f.ready());
  CHECK(f.error() == "pull of keys [0, 10) failed: no reply from shard 0 (test) within 2500 ms");
  caf::anon_send_exit(s, caf::exit_reason::kill);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "rows: bad requests are refused on the caller's thread; a silent shard fails them at the "
                           "timeout, naming the table") {
  auto s = sys.spawn(silent_shard);
  auto view = one_shard_view(s);
  sparse_table_spec emb{"emb", 4, 0.01f, update_rule{}, 1};
  view.tables.push_back(table_msg::from(emb));
  kv_client kv(sys, view, {{0, "shard 0 (test)", s}}, {0, default_chunk_bytes, milliseconds(2500)});
  CHECK(kv.table_dim(0) == 4);
  CHECK_THROWS_WITH_AS(kv.pull_rows(1, {5}), "no sparse table 1 (the job has 1)", bad_request);
  CHECK_THROWS_WITH_AS(kv.push_rows(0, {5, 6}, std::vector<float>(4, 1.0f)),
                       "push of 2 rows of table 'emb' (dim 4): 4 gradient values, not 8", bad_request);
  auto none = kv.pull_rows(0, {});
  sched.run();
  REQUIRE(none.ready());  // nothing to ask: done at once
  CHECK(none.error().empty());
  auto f = kv.pull_rows(0, {5, 9, 5});
  sched.run();
  CHECK_FALSE(f.ready());
  sched.clock().advance_time(milliseconds(2501));
  sched.run();
  REQUIRE(f.ready());
  CHECK(f.error() == "pull of 3 rows of table 'emb' failed: no reply from shard 0 (test) within 2500 ms");
  caf::anon_send_exit(s, caf::exit_reason::kill);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "a shard dying with requests in flight fails them at once; later ones too") {
  auto s = sys.spawn(silent_shard);
  auto view = one_shard_view(s);
  kv_client kv(sys, view, {{0, "shard 0 (test)", s}}, {0, default_chunk_bytes, milliseconds(60000)});
  auto f = kv.push(key_set::single({0, 3}), {1, 2, 3});
  auto g = kv.pull(key_set::single({0, 3}));
  sched.run();
  CHECK_FALSE(f.ready());
  CHECK(kv.awaited_answers() == 2);
  caf::anon_send_exit(s, caf::exit_reason::kill);
  sched.run();  // no clock advance: the down message alone fails the op
  REQUIRE(f.ready());
  CHECK(f.error().find("push") == 0);
  CHECK(f.error().find("shard 0 (test) is down") != std::string::npos);
  REQUIRE(g.ready());
  CHECK(g.error().find("shard 0 (test) is down") != std::string::npos);
  // The silent shard took both requests before it died, so nothing bounced them: a dead
  // remote peer is the same (docs/wire-and-caf.md, "CAF 0.17 facts"). The client lets go of their handlers itself.
  CHECK(kv.awaited_answers() == 0);
  auto later = kv.pull(key_set::single({0, 3}));
  sched.run();
  REQUIRE(later.ready());
  CHECK(later.error().find("shard 0 (test) is down") != std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "a request bounced by a shard that ended with it unread fails once, naming the shard") {
  // The bounce (request_receiver_down) comes before the down message: the client learns of
  // the death from the bounce, which fails every request to the shard, this one included.
  auto s = sys.spawn(silent_shard);
  auto view = one_shard_view(s);
  kv_client kv(sys, view, {{0, "shard 0 (test)", s}}, {0, default_chunk_bytes, milliseconds(60000)});
  auto f = kv.pull(key_set::single({0, 3}));
  auto g = kv.push(key_set::single({0, 3}), {1, 2, 3});
  sched.run_once();  // the client sends both; the shard has not read them
  REQUIRE_FALSE(f.ready());
  caf::anon_send_exit(s, caf::exit_reason::kill);
  sched.run();
  REQUIRE(f.ready());
  REQUIRE(g.ready());
  CHECK(f.error().find("shard 0 (test) is down") != std::string::npos);
  CHECK(g.error().find("shard 0 (test) is down") != std::string::npos);
  CHECK(kv.awaited_answers() == 0);
}

TEST_CASE_FIXTURE(fixture, "a pull whose answer names a payload that never comes is asked again, twice at most") {
  // The answering copy died before writing the payload, before its process ever connected
  // to this one: no end of a connection tells, only the claim timeout (50 ms here).
  auto s = sys.spawn(silent_shard);
  auto view = one_shard_view(s);
  kv_client_options opts{0, default_chunk_bytes, milliseconds(60000)};
  opts.plane = data_plane::shared(std::make_unique<data_plane>("127.0.0.1", 1024, milliseconds(50), milliseconds(10000)));
  kv_client kv(sys, view, {{0, "shard 0 (test)", s}}, opts);
  auto& shard = dynamic_cast<shard_actor::stateful_pointer<silent_state>>(caf::actor_cast<caf::abstract_actor*>(s))
                  ->state;
  float_block lost;  // what a dead copy's answer says: ticket 9 of a process never heard of
  lost.size = 3;
  lost.ticket = 9;
  lost.origin = 0x5eed;
  auto claim_times_out = [&] {
    sched.clock().advance_time(milliseconds(50));
    sched.run();
  };
  shard.pull_answers = {lost, float_block::own({1.0f, 2.0f, 3.0f})};
  auto f = kv.pull(key_set::single({0, 3}));
  sched.run();
  CHECK(shard.pulls == 1);
  CHECK_FALSE(f.ready());  // its claim waits
  claim_times_out();
  CHECK(shard.pulls == 2);  // asked again, and answered with the values this time
  REQUIRE(f.ready());
  CHECK(f.get() == std::vector<float>{1.0f, 2.0f, 3.0f});

  // A payload lost every time: the third loss fails the pull, naming it.
  shard.pull_answers = {lost, lost, lost};
  auto g = kv.pull(key_set::single({0, 3}));
  sched.run();
  for (int ask = 0; ask < 3; ++ask) claim_times_out();
  CHECK(shard.pulls == 5);
  REQUIRE(g.ready());
  CHECK(g.error().find("payload 9 (3 floats) from process 24301 did not arrive within 50 ms") != std::string::npos);

  // The shard goes down while the claim waits: the payload's process never connected, so
  // nothing else would tell; the claim fails at once, and its pull with the shard.
  shard.pull_answers = {lost};
  auto h = kv.pull(key_set::single({0, 3}));
  sched.run();
  REQUIRE_FALSE(h.ready());
  caf::anon_send_exit(s, caf::exit_reason::kill);
  sched.run();  // no clock advance
  REQUIRE(h.ready());
  CHECK(h.error().find("shard 0 (test) is down") != std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "on a crowded host the client keeps --ps.crowded-inflight-bytes in flight per shard, "
                           "not --ps.inflight-bytes, in push chunks of --ps.push-chunk-bytes, not "
                           "--ps.tcp-push-chunk-bytes") {
  const auto cpus = std::max(1u, std::thread::hardware_concurrency());
  auto plane = data_plane::shared(std::make_unique<data_plane>("127.0.0.1", 1024, milliseconds(10000), milliseconds(10000)));
  auto pushes_in_flight = [&](bool crowded) {
    auto s = sys.spawn(silent_shard);
    auto view = one_shard_view(s);
    kv_client_options opts{0, default_chunk_bytes, milliseconds(60000)};
    // The defaults: 8 MiB in flight in 512 KiB push chunks (the shard is reached over TCP),
    // on a crowded host 1 MiB in 1 MiB chunks.
    opts.plane = plane;
    kv_client kv(sys, view, {{0, "shard 0 (test)", s}}, opts);
    REQUIRE(plane->host_crowded() == crowded);
    const key_type keys = 4u << 18;  // 4 MiB of floats: 8 chunks, or 4 on a crowded host
    kv.push(key_set::single({0, keys}), std::vector<float>(keys, 1.0f));
    sched.run();
    auto pushes = dynamic_cast<shard_actor::stateful_pointer<silent_state>>(caf::actor_cast<caf::abstract_actor*>(s))
                    ->state.pushes;
    caf::anon_send_exit(s, caf::exit_reason::kill);
    sched.run();
    return pushes;
  };
  CHECK(pushes_in_flight(cpus < 2) == (cpus < 2 ? 1u : 8u));
  // Peers on this host, as many as the CPUs: with the plane's process, more than the CPUs.
  std::vector<std::unique_ptr<data_plane>> peers;
  for (unsigned i = 0; i < cpus; ++i) {
    peers.push_back(std::make_unique<data_plane>("127.0.0.1", 1024, milliseconds(10000), milliseconds(10000)));
    std::string why;
    REQUIRE_MESSAGE(peers.back()->connect(plane->token(), "127.0.0.1", plane->port(), &why), why);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!plane->host_crowded() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  CHECK(pushes_in_flight(true) == 1u);
}

TEST_CASE_FIXTURE(fixture, "a request sent again after --ps.retry-ms awaits one answer, not one per sending") {
  auto s = sys.spawn(silent_shard);
  auto view = one_shard_view(s);
  kv_client_options opts{0, default_chunk_bytes, milliseconds(60000)};
  opts.retry = milliseconds(100);
  kv_client kv(sys, view, {{0, "shard 0 (test)", s}}, opts);
  auto held = [&] {
    return dynamic_cast<shard_actor::stateful_pointer<silent_state>>(caf::actor_cast<caf::abstract_actor*>(s))
      ->state.held.size();
  };
  auto f = kv.pull(key_set::single({0, 3}));
  sched.run();
  CHECK(kv.awaited_answers() == 1);
  for (std::size_t sending = 2; sending <= 4; ++sending) {
    sched.clock().advance_time(milliseconds(100));
    sched.run();
    CAPTURE(sending);
    CHECK(held() == sending);  // the shard got it again ...
    CHECK(kv.awaited_answers() == 1);  // ... and only the newest sending's answer counts
  }
  CHECK_FALSE(f.ready());
  caf::anon_send_exit(s, caf::exit_reason::kill);
  sched.run();
  REQUIRE(f.ready());
  CHECK(kv.awaited_answers() == 0);
}

TEST_CASE_FIXTURE(fixture, "then() chains run when the op completes") {
  auto coord = spawn_coordinator(1, 1);
  spawn_shard(coord);
  auto reg = register_worker(coord);
  sched.run();
  REQUIRE(reg->has_value());
  kv_client kv(sys, (*reg)->view, links_of((*reg)->view), {0, default_chunk_bytes, milliseconds(1000)});
  auto keys = key_set::from_keys({1, 2, 3});
  std::vector<float> seen;
  kv.push(keys, {1, 2, 3}).then([&](kv_future) {
    kv.pull(keys).then([&](kv_future f) { seen = f.get(); });
  });
  sched.run();
  CHECK(seen == std::vector<float>{1, 2, 3});
}

TEST_CASE_FIXTURE(fixture, "barriers release when all live workers arrive; a dead worker is reported (not a failure) and not waited for") {
  auto box = std::make_shared<inbox>();
  auto observer = spawn_inbox(box);
  auto coord = spawn_coordinator(1, 2, observer);
  spawn_shard(coord);
  // Two workers, as actors that register and then enter a barrier.
  auto arrivals = std::make_shared<int>(0);
  auto worker = [&](bool enter_barrier) {
    return alive.emplace_back() = sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
      self->request(coord, caf::infinite, register_atom::value, node_info{"worker", "", 0, 0, {}, 0, 0, protocol_version, {}})
        .then([=](registration& reg) {
          if (enter_barrier)
            self->request(coord, caf::infinite, barrier_atom::value, reg.id, reg.barrier_generation)
              .then([=](std::uint64_t) { ++*arrivals; });
        });
      return {[](caf::unit_t) {}};  // stay alive: leaving means going down
    });
  };
  worker(true);
  auto doomed = worker(false);
  sched.run();
  CHECK(*arrivals == 0);  // waiting for the second worker
  caf::anon_send_exit(doomed, caf::exit_reason::kill);
  sched.run();
  CHECK(*arrivals == 1);  // released: the dead worker no longer counts
  // Reported, not a failure: the job goes on without it.
  CHECK(box->count<job_failed_atom, std::string>() == 0);
  // The news: each member's registration (1 server, 2 workers), then the loss.
  REQUIRE(box->count<news_atom, std::string>() == 4);
  std::vector<std::string> news;
  for (const auto& m : box->messages)
    if (m.match_elements<news_atom, std::string>()) news.push_back(m.get_as<std::string>(1));
  CHECK(news[0].find("server shard 0 registered (1 of 1 servers, 0 of 2 workers)") != std::string::npos);
  CHECK(news[2].find("worker 1 registered (1 of 1 servers, 2 of 2 workers)") != std::string::npos);
  CHECK(news[3].find("worker 1 went down") != std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "the coordinator refuses unknown roles and extra members") {
  auto coord = spawn_coordinator(1, 1);
  auto errors = std::make_shared<std::vector<std::string>>();
  for (auto role : {"gardener", "worker", "worker"})
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(coord, caf::infinite, register_atom::value, node_info{role, "", 0, 0, {}, 0, 0, protocol_version, {}})
        .then([](registration&) {}, [=](caf::error& e) { errors->push_back(describe(e)); });
    });
  sched.run();
  REQUIRE(errors->size() == 2);
  CHECK((*errors)[0].find("unknown role \"gardener\"") != std::string::npos);
  CHECK((*errors)[1].find("all 1 workers have registered already") != std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "compressed pushes: fp16 of integers is exact, top-k sends the rest later, corrupt data is refused") {
  auto [shard, reg] = two_shards_one_worker();
  auto keys = key_set::single({0, 10000});
  std::vector<float> g(10000);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 100);
  {
    kv_client kv(sys, reg.view, links_of(reg.view),
                 {0, default_chunk_bytes, milliseconds(1000), 8u << 20, parse_codec("fp16")});
    settle(kv.push(keys, g));
    CHECK(settle(kv.pull(keys)) == g);  // integers below 2048 are exact in fp16
  }
  {
    // Top-k with error feedback: 50% per push, the residual goes out with the next push;
    // pushing g then zeros leaves exactly 2g on the servers (g from the first test + g).
    kv_client kv(sys, reg.view, links_of(reg.view),
                 {0, default_chunk_bytes, milliseconds(1000), 8u << 20, parse_codec("topk:0.5")});
    settle(kv.push(keys, g));
    auto partial = settle(kv.pull(keys));
    CHECK(partial != std::vector<float>(g.size(), 0) );
    std::size_t behind = 0;
    for (std::size_t i = 0; i < g.size(); ++i) behind += partial[i] != 2 * g[i];
    CHECK(behind > 0);  // not everything went out yet
    settle(kv.push(keys, std::vector<float>(g.size(), 0.0f)));
    auto after = settle(kv.pull(keys));
    for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(after[i] == 2 * g[i]);
  }
  auto box = std::make_shared<inbox>();
  auto junk = std::make_shared<std::vector<std::byte>>(10, std::byte{7});
  sys.spawn([=](caf::event_based_actor* self) {
    self->request(shard, caf::infinite, push_atom::value, request_header{1, 0, 0, 1}, range_list{{{0, 3}}},
                  encoded_block{junk})
      .then([=](std::uint64_t) {}, [=](caf::error& e) { box->messages.push_back(caf::make_message(describe(e))); });
  });
  sched.run();
  REQUIRE(box->messages.size() == 1);
  auto err = box->messages[0].get_as<std::string>(0);
  INFO(err);
  CHECK(err.find("shard 0: compressed push from worker 0:") != std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "compressed pulls: answers encoded by the shard, decoded within the codec's bound, in any chunking") {
  auto [shard, reg] = two_shards_one_worker();
  const std::size_t n = 10000;
  auto keys = key_set::single({0, n});
  std::vector<float> w(n);
  float maxabs = 0;
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = std::sin(static_cast<float>(i) * 0.37f) * 3.0f;  // not representable in fp16 or int8
    maxabs = std::max(maxabs, std::fabs(w[i]));
  }
  kv_client exact(sys, reg.view, links_of(reg.view), {0, default_chunk_bytes, milliseconds(1000)});
  // Two inits: the stores hold two segments, so an answer crossing key 5000 is gathered from
  // both before it is encoded, while the others are encoded straight from one.
  settle(exact.init(key_set::single({0, n / 2}), std::vector<float>(w.begin(), w.begin() + n / 2)));
  settle(exact.init(key_set::single({n / 2, n}), std::vector<float>(w.begin() + n / 2, w.end())));
  REQUIRE(settle(exact.pull(keys)) == w);
  for (const char* spec : {"fp16", "int8"}) {
    for (std::uint64_t chunk_bytes : {default_chunk_bytes, std::uint64_t{4096}}) {  // one chunk per shard, or many
      INFO(spec << ", chunks of " << chunk_bytes << " bytes");
      kv_client_options opts{0, chunk_bytes, milliseconds(1000)};
      opts.pull_compression = parse_codec(spec);
      kv_client kv(sys, reg.view, links_of(reg.view), opts);
      auto got = settle(kv.pull(keys));
      REQUIRE(got.size() == n);
      std::size_t inexact = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const float bound = std::string(spec) == "fp16" ? std::max(std::fabs(w[i]) * 0x1p-11f, 0x1p-25f)
                                                        : maxabs / 127 * (0.5f + 0x1p-15f);
        INFO("key " << i << ": " << w[i] << " came back as " << got[i]);
        REQUIRE(std::fabs(got[i] - w[i]) <= bound);
        inexact += got[i] != w[i];
      }
      CHECK(inexact > n / 2);  // the answers were really encoded
    }
  }
  // A codec the shard does not offer for pulls is refused, naming it.
  key_type k0 = 0;
  while (exact.map().owner(k0) != 0) ++k0;
  auto box = std::make_shared<inbox>();
  request_header topk_pull{1, 0, 0, 1};
  topk_pull.pull_codec = static_cast<std::uint8_t>(codec_kind::topk);
  sys.spawn([=](caf::event_based_actor* self) {
    self->request(shard, caf::infinite, pull_atom::value, topk_pull, range_list{{{k0, k0 + 3}}})
      .then([=](float_block&) {}, [=](caf::error& e) { box->messages.push_back(caf::make_message(describe(e))); });
  });
  sched.run();
  REQUIRE(box->messages.size() == 1);
  auto err = box->messages[0].get_as<std::string>(0);
  INFO(err);
  CHECK(err.find("shard 0: pull codec 3 is not fp16 (1) or int8 (2)") != std::string::npos);
  kv_client_options topk{0, default_chunk_bytes, milliseconds(1000)};
  topk.pull_compression = parse_codec("topk");
  CHECK_THROWS_WITH_AS(kv_client(sys, reg.view, links_of(reg.view), topk),
                       doctest::Contains("not top-k"), bad_request);
}

TEST_CASE_FIXTURE(fixture, "checkpointer: a flush is answered once the complete files handed to the writer are written") {
  // A stand-in file writer that answers only when told (ok): the file is "being written".
  auto pending = std::make_shared<std::vector<caf::response_promise>>();
  auto writer_actor = sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    return {[=](write_atom, const std::shared_ptr<const checkpoint>& c) {
              CHECK(c->header.clock == 8);
              CHECK(c->shards.size() == 2);
              pending->push_back(self->make_response_promise());
            },
            [=](caf::ok_atom) {
              for (auto& rp : *pending) rp.deliver(std::string("dir/checkpoint-8.apsckpt"));
            }};
  });
  auto writer = caf::actor_cast<checkpoint_file_writer_actor>(writer_actor);
  checkpointer_options o;
  o.header.shard_ids = {0, 1};
  o.file_writer = writer;
  auto ckpt = sys.spawn(checkpointer, o);
  auto flushed = std::make_shared<int>(0);
  auto ask_flush = [&] {
    alive.push_back(sys.spawn([=](caf::event_based_actor* self) {
      self->request(ckpt, caf::infinite, flush_atom::value).then([=](caf::ok_atom) { ++*flushed; });
    }));
  };
  ask_flush();
  sched.run();
  CHECK(*flushed == 1);  // nothing being written: at once
  for (std::uint32_t shard : {0u, 1u})
    caf::anon_send(ckpt, snapshot_atom::value, shard, std::uint64_t{8}, std::uint64_t{1},
                   snapshot_block(shard_snapshot{shard, {}, {}, {}, 0}));
  sched.run();
  REQUIRE(pending->size() == 1);  // both parts in: the file went to the writer
  ask_flush();
  sched.run();
  CHECK(*flushed == 1);  // waits for the file
  caf::anon_send(writer_actor, caf::ok_atom::value);
  sched.run();
  CHECK(*flushed == 2);
  alive.push_back(writer_actor);
  alive.push_back(caf::actor_cast<caf::actor>(ckpt));
}

TEST_CASE_FIXTURE(fixture, "checkpointer: a round with a part that came while the map changed is never written; later ones are") {
  auto clocks = std::make_shared<std::vector<std::uint64_t>>();  // of the files handed to the writer
  auto writer_actor = sys.spawn([=](caf::event_based_actor*) -> caf::behavior {
    return {[=](write_atom, const std::shared_ptr<const checkpoint>& c) -> std::string {
      clocks->push_back(c->header.clock);
      return "dir/checkpoint-" + std::to_string(c->header.clock) + ".apsckpt";
    }};
  });
  checkpointer_options o;
  o.header.shard_ids = {0, 1};
  o.file_writer = caf::actor_cast<checkpoint_file_writer_actor>(writer_actor);
  auto ckpt = sys.spawn(checkpointer, o);
  auto part = [&](std::uint32_t shard, std::uint64_t clock) {
    caf::anon_send(ckpt, snapshot_atom::value, shard, clock, std::uint64_t{1}, snapshot_block(shard_snapshot{shard, {}, {}, {}, 0}));
    sched.run();
  };
  part(0, 10);  // before the change: its round would be complete with shard 1's part
  caf::anon_send(ckpt, map_change_atom::value, true);
  part(1, 10);  // cut while keys may be on their way to it
  part(0, 12);
  caf::anon_send(ckpt, map_change_atom::value, false);
  part(1, 12);  // the change is over, but its round had a part from during it
  CHECK(clocks->empty());
  part(0, 14);
  part(1, 14);
  CHECK(*clocks == std::vector<std::uint64_t>{14});
  alive.push_back(writer_actor);
  alive.push_back(caf::actor_cast<caf::actor>(ckpt));
}

TEST_CASE_FIXTURE(fixture, "write tracker: drained is answered once as many payloads as issued are written or "
                           "dropped; a payload written while nobody waits sends it nothing") {
  auto writes = std::make_shared<store_writes>();
  auto tracker = sys.spawn(write_tracker, writes);
  sched.run();
  auto first = written_signal(tracker, writes);
  auto second = written_signal(tracker, writes);
  auto third = written_signal(tracker, writes);
  auto drained = std::make_shared<int>(0);
  auto ask = [&](std::uint64_t issued) {
    alive.push_back(sys.spawn([=](caf::event_based_actor* self) {
      self->request(tracker, caf::infinite, drained_atom::value, issued).then([=](caf::ok_atom) { ++*drained; });
    }));
  };
  ask(0);
  sched.run();
  CHECK(*drained == 1);  // nothing issued: at once
  third.reset();         // written with no wait: counted, and no message wakes the tracker
  CHECK(writes->done == 1);
  CHECK_FALSE(sched.has_job());
  ask(3);
  sched.run();
  CHECK(*drained == 1);  // two on their way
  first.reset();         // written
  sched.run();
  CHECK(writes->done == 2);
  CHECK(*drained == 1);
  second.reset();  // dropped with its connection: counts the same
  sched.run();
  CHECK(writes->done == 3);
  CHECK(*drained == 2);
  CHECK_FALSE(writes->awaited);  // no wait left: later signals stay quiet
  alive.push_back(caf::actor_cast<caf::actor>(tracker));
}

namespace {

// A coordinator with 2 shards and 1 worker registered (the job runs), at this staleness.
struct running_pair : fixture {
  std::pair<coordinator_actor, std::shared_ptr<std::optional<registration>>> two_shards_running(std::uint64_t staleness) {
    coordinator_options o;
    o.servers = 2;
    o.workers = 1;
    o.staleness = staleness;
    auto coord = spawn_coordinator(o);
    spawn_shard(coord);
    spawn_shard(coord);
    auto reg = register_worker(coord);
    sched.run();
    REQUIRE(reg->has_value());
    return {coord, reg};
  }
};

}  // namespace

TEST_CASE_FIXTURE(running_pair, "a shard joins a running job: the old shards hand it what the new map moves, with values") {
  auto [coord, first] = two_shards_running(infinite_staleness);
  const std::uint64_t n = 1u << 16;  // 16 buckets of 4096 keys
  auto keys = key_set::single({0, n});
  std::vector<float> values(n);
  for (std::uint64_t k = 0; k < n; ++k) values[k] = static_cast<float>(k);
  {
    kv_client before(sys, (*first)->view, links_of((*first)->view), {0, default_chunk_bytes, milliseconds(1000)});
    REQUIRE(settle(before.push(keys, values)).empty());
  }
  spawn_shard(coord);  // registers while the job runs: it joins
  sched.run();
  auto joiner = register_worker(coord);  // a later member gets the map after the join
  sched.run();
  REQUIRE(joiner->has_value());
  const auto& view = (*joiner)->view;
  REQUIRE(view.shards.size() == 3);
  CHECK(view.epoch == 2);
  auto map = map_of(view);
  std::uint64_t on_newcomer = 0;
  for (std::uint64_t k = 0; k < n; k += 4096) on_newcomer += map.owner(k) == 2;
  CHECK(on_newcomer > 0);
  CHECK(on_newcomer <= 8);  // about a third of 16 buckets, never half
  kv_client after(sys, view, links_of(view), {(*joiner)->id, default_chunk_bytes, milliseconds(1000)});
  CHECK(settle(after.pull(keys)) == values);  // every key, wherever it lives now, holds its value
  // A request by the old map for a key that moved is refused as moved, naming the owner.
  kv_client stale(sys, (*first)->view, links_of((*first)->view), {0, default_chunk_bytes, milliseconds(1000)});
  key_type gone = 0;
  while (map.owner(gone) != 2) gone += 4096;
  // A client that never hears of the new map (no coordinator) waits for it at most its
  // request timeout, then says what happened.
  auto refused = stale.pull(key_set::single({gone, gone + 1}));
  sched.run();
  CHECK_FALSE(refused.ready());
  sched.clock().advance_time(milliseconds(1000));
  sched.run();
  REQUIRE(refused.ready());
  CHECK(refused.error().find("its keys moved to another shard and no map naming the new owner came within 1000 ms") !=
        std::string::npos);
}

TEST_CASE_FIXTURE(running_pair, "a shard joins, then one leaves, under BSP traffic: clients follow; nothing lost, nothing twice") {
  const std::uint64_t n = 1u << 16;
  auto keys = key_set::single({0, n});
  std::vector<float> values(n), ones(n, 1.0f);
  for (std::uint64_t k = 0; k < n; ++k) values[k] = static_cast<float>(k);
  auto wrong = [&](const std::vector<float>& got, float plus) {
    std::size_t bad = got.size() == n ? 0 : n;
    for (std::uint64_t k = 0; k < got.size(); ++k) bad += got[k] != static_cast<float>(k) + plus;
    return bad;
  };
  // Requests issued after this many scheduler steps of the join: before the old shards
  // hand over, while they do, and after the clients have the new map.
  int whole_join = 0;  // steps the join took when nothing else ran
  for (int steps = 0; steps <= 64; steps += 2) {
    CAPTURE(steps);
    auto [coord, reg] = two_shards_running(0);
    kv_client_options ko{(*reg)->id, 16384, milliseconds(5000)};  // 1,024 keys a chunk: many requests in flight
    ko.coordinator = coord;
    kv_client kv(sys, (*reg)->view, links_of((*reg)->view), ko);
    REQUIRE(settle(kv.push(keys, values)).empty());
    REQUIRE(settle(kv.advance_clock(1)).empty());
    spawn_shard(coord);
    int ran = 0;
    while (ran < steps && sched.try_run_once()) ++ran;
    if (ran < steps) whole_join = std::max(whole_join, ran);
    auto push = kv.push(keys, ones);
    auto rows_free_tick = kv.advance_clock(2);
    auto read = kv.pull(keys);
    sched.run();
    if (!read.ready()) {
      sched.clock().advance_time(milliseconds(30000));
      sched.run();
      if (read.ready()) MESSAGE("read: " << read.error());
    }
    REQUIRE(push.ready());
    REQUIRE(rows_free_tick.ready());
    REQUIRE(read.ready());
    CHECK(push.error() == "");
    CHECK(read.error() == "");
    CHECK(wrong(read.get(), 1.0f) == 0);  // BSP: exactly the pushes of clocks 0 and 1
    CHECK(kv.map().shard_ids().size() == 3);
    REQUIRE(settle(kv.push(keys, ones)).empty());
    REQUIRE(settle(kv.advance_clock(3)).empty());
    CHECK(wrong(settle(kv.pull(keys)), 2.0f) == 0);
    // Shard 0 leaves the same way: requests race with its drain.
    auto left = std::make_shared<std::string>();
    alive.push_back(sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
      self->request(coord, caf::infinite, remove_shard_atom::value, std::uint32_t{0})
        .then([=](std::string& news) { *left = news; }, [=](caf::error& e) { *left = "error: " + describe(e); });
      return {[](caf::unit_t) {}};
    }));
    for (int i = 0; i < steps && sched.try_run_once(); ++i) {
    }
    auto push2 = kv.push(keys, ones);
    auto tick2 = kv.advance_clock(4);
    auto read2 = kv.pull(keys);
    sched.run();
    REQUIRE(read2.ready());
    CHECK(push2.error() == "");
    CHECK(tick2.error() == "");
    CHECK(read2.error() == "");
    CHECK(wrong(read2.get(), 3.0f) == 0);
    CHECK(left->find("shard 0 left") == 0);
    CHECK(kv.map().shard_ids() == std::vector<std::uint32_t>{1, 2});
    REQUIRE(settle(kv.push(keys, ones)).empty());
    REQUIRE(settle(kv.advance_clock(5)).empty());
    CHECK(wrong(settle(kv.pull(keys)), 4.0f) == 0);
    sched.run();
  }
  CHECK(whole_join > 10);  // the steps above began before, during and after the handoffs
  CHECK(whole_join < 64);
}

TEST_CASE_FIXTURE(fixture, "remove-shard refuses, naming why: a job not formed, an unknown shard, the last shard, "
                           "another change under way (for now: busy)") {
  // The answer, or "error CODE: why".
  auto send_remove = [&](coordinator_actor coord, std::uint32_t id) {
    auto answer = std::make_shared<std::string>();
    alive.push_back(sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
      self->request(coord, caf::infinite, remove_shard_atom::value, id)
        .then([=](std::string& news) { *answer = news; },
              [=](caf::error& e) {
                *answer = "error " + std::to_string(static_cast<int>(code_of(e))) + ": " + describe(e);
              });
      return {[](caf::unit_t) {}};
    }));
    return answer;
  };
  auto ask = [&](coordinator_actor coord, std::uint32_t id) {
    auto answer = send_remove(coord, id);
    sched.run();
    return *answer;
  };
  auto forming = spawn_coordinator(2, 1);
  spawn_shard(forming);
  CHECK(ask(forming, 0).find("the job has not formed yet") != std::string::npos);
  spawn_shard(forming);  // it forms (a coordinator left forming does not end with the test)
  auto formed = register_worker(forming);
  sched.run();
  REQUIRE(formed->has_value());
  auto coord = spawn_coordinator(1, 1);
  spawn_shard(coord);
  auto w = register_worker(coord);
  sched.run();
  REQUIRE(w->has_value());
  CHECK(ask(coord, 3).find("error 2: coordinator: shard 3 cannot leave: there is no such shard in the map") == 0);
  CHECK(ask(coord, 0).find("shard 0 cannot leave: it is the last shard") != std::string::npos);
  // Two removals at once: the second is refused for now (errc::busy, 10), which psctl
  // rolling-restart and a draining server ask again.
  auto three = spawn_coordinator(3, 1);
  for (int i = 0; i < 3; ++i) spawn_shard(three);
  auto w3 = register_worker(three);
  sched.run();
  REQUIRE(w3->has_value());
  auto first = send_remove(three, 0);
  auto second = send_remove(three, 1);
  sched.run();
  CHECK(first->find("shard 0 left") == 0);
  CHECK(second->find("error 10: coordinator: shard 1 cannot leave: another shard is joining or leaving; try again") ==
        0);
}

TEST_CASE_FIXTURE(fixture, "disk tier I/O: reads cut into units for idle readers are answered whole, each key in its "
                           "place, found or not, with reads of several requests in flight at once") {
  scratch_dir scratch;
  if (!scratch.holds_disk_tier()) return;
  row_io_settings settings;
  settings.on_threads = false;  // on the test scheduler: deterministic
  settings.readers = 3;
  auto io = sys.spawn(row_io, scratch.path.string(), std::string("shard 0"), std::vector<std::size_t>{2},
                      std::string(), settings);
  alive.push_back(caf::actor_cast<caf::actor>(io));
  // Rows 0..29 of table 0: row i is {i, -i}, last pushed at clock i + 1.
  auto rows = std::make_shared<row_write>();
  rows->seq = 1;
  for (std::uint64_t i = 0; i < 30; ++i) {
    rows->keys.push_back({0, i});
    rows->rows.insert(rows->rows.end(), {static_cast<float>(i), -static_cast<float>(i)});
    rows->pushed.push_back(i + 1);
  }
  // 13 keys (4 units, the last of one key), rows missing among them, out of order; and 2.
  const std::vector<std::uint64_t> long_ids{29, 100, 0, 7, 101, 3, 12, 13, 200, 5, 28, 1, 102};
  const std::vector<std::uint64_t> short_ids{102, 4};
  auto keys_of = [](const std::vector<std::uint64_t>& ids) {
    auto keys = std::make_shared<std::vector<row_key>>();
    for (auto id : ids) keys->push_back({0, id});
    return std::shared_ptr<const std::vector<row_key>>(std::move(keys));
  };
  const auto long_keys = keys_of(long_ids), short_keys = keys_of(short_ids);
  auto written = std::make_shared<std::uint64_t>(0);
  auto answers = std::make_shared<std::vector<std::shared_ptr<const disk_rows>>>();
  alive.push_back(sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    self->request(io, caf::infinite, write_rows_atom::value, std::shared_ptr<const row_write>(rows))
      .then([=](std::uint64_t seq) {
        *written = seq;
        for (const auto& keys : {long_keys, short_keys})  // both in flight at once
          self->request(io, caf::infinite, read_rows_atom::value, keys)
            .then([=](std::shared_ptr<const disk_rows>& got) { answers->push_back(got); });
      });
    return {[](caf::unit_t) {}};
  }));
  sched.run();
  CHECK(*written == 1);
  REQUIRE(answers->size() == 2);
  for (const auto& got : *answers) {
    const auto& ids = got->keys == long_keys ? long_ids : short_ids;
    REQUIRE(got->keys->size() == ids.size());
    REQUIRE(got->found.size() == ids.size());
    REQUIRE(got->pushed.size() == ids.size());
    std::vector<float> expected_rows;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const bool stored = ids[i] < 30;
      CHECK(got->found[i] == (stored ? 1 : 0));
      CHECK(got->pushed[i] == (stored ? ids[i] + 1 : 0));
      if (stored) expected_rows.insert(expected_rows.end(), {static_cast<float>(ids[i]), -static_cast<float>(ids[i])});
    }
    CHECK(got->rows == expected_rows);
  }
  CHECK(((*answers)[0]->keys == long_keys) != ((*answers)[1]->keys == long_keys));  // one answer each
}
