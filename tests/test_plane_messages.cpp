// Messages between actors over data connections (data_plane::enable_messages), in one
// process over real loopback sockets: a request through a proxy reaches the served actor
// and its answer comes back the same way; what the actor does not serve is refused with
// an error; a request whose connection ends, or that has no connection, is answered
// errc::unsent at once rather than left to its timeout.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <thread>

#include <caf/all.hpp>

#include "actors/data_plane.hpp"
#include "actors/messages.hpp"
#include "raw_peer.hpp"

using namespace ps;
using namespace std::chrono_literals;

namespace {

// Answers a tick with its clock plus one; a tick of clock 0 is never answered.
using held_promises = std::shared_ptr<std::vector<caf::response_promise>>;

caf::behavior ticker(caf::event_based_actor* self, held_promises held) {
  return {
    [=](clock_atom, const request_header& h) -> caf::result<std::uint64_t> {
      if (h.clock > 0) return h.clock + 1;
      held->push_back(self->make_response_promise());
      return caf::delegated<std::uint64_t>();
    },
    [=](data_atom) { return std::string("not over data connections"); },
  };
}

// Whether `holds` came true within 10 s (asked again and again meanwhile): what another
// thread does here is bounded, never slept for.
template <class Pred>
bool within_10s(Pred holds) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!holds())
    if (std::chrono::steady_clock::now() > until) return false;
    else std::this_thread::yield();
  return true;
}

struct plane_fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys;
  std::unique_ptr<data_plane> worker, server;
  caf::scoped_actor asker{sys};
  std::vector<caf::actor> tickers;  // ended with the fixture

  // busy_poll: how long the planes' readers poll before they sleep (data_plane's).
  explicit plane_fixture(std::chrono::microseconds busy_poll = 0us)
      : sys(init(cfg)),
        worker(std::make_unique<data_plane>("127.0.0.1", 1024, 10s, 10s, std::nullopt, 0, busy_poll)),
        server(std::make_unique<data_plane>("127.0.0.1", 1024, 10s, 10s, std::nullopt, 0, busy_poll)) {
    worker->enable_messages(sys);
    server->enable_messages(sys);
    worker->serve(caf::actor_cast<caf::strong_actor_ptr>(asker), [](caf::message_id mid, const caf::message&) {
      return mid.is_response();
    });
  }
  ~plane_fixture() {
    for (auto& t : tickers) caf::anon_send_exit(t, caf::exit_reason::user_shutdown);
  }
  caf::actor spawn_ticker() {
    tickers.push_back(sys.spawn(ticker, std::make_shared<std::vector<caf::response_promise>>()));
    return tickers.back();
  }
  static caf::actor_system_config& init(caf::actor_system_config& c) {
    register_types(c);
    return c;
  }
  // Serves `target` on the server plane (clock ticks only) and returns the proxy of it
  // that `from` (the worker plane unless said) makes, once the server has said that it
  // takes messages.
  caf::actor connect_to(const caf::actor& target) { return connect_to(target, *worker); }
  caf::actor connect_to(const caf::actor& target, data_plane& from) {
    server->serve(caf::actor_cast<caf::strong_actor_ptr>(target), [](caf::message_id mid, const caf::message& msg) {
      return mid.is_request() && msg.match_element<caf::atom_value>(0) && msg.get_as<caf::atom_value>(0) == clock_atom::value;
    });
    std::string why;
    REQUIRE_MESSAGE(from.connect(server->token(), "127.0.0.1", server->port(), &why), why);
    REQUIRE(from.takes_messages(server->token(), 5s));  // its word crosses the connection once
    auto proxy = from.proxy(server->token(), target.id(), target.node());
    REQUIRE(proxy);
    return caf::actor_cast<caf::actor>(proxy);
  }
  // Ticks of clocks first..last sent to `to` while `batch` is open on this thread, their
  // answers awaited by check_answers.
  auto ticks_in_batch(write_batch& batch, const caf::actor& to, std::uint64_t first, std::uint64_t last) {
    std::vector<decltype(asker->request(to, 10s, clock_atom::value, request_header{}))> asked;
    write_batch::scope open(batch);
    for (auto c = first; c <= last; ++c) asked.push_back(asker->request(to, 10s, clock_atom::value, request_header{1, 0, c, 7}));
    return asked;
  }
  // Each answer is its tick's clock plus one (the first tick's clock is `first`).
  template <class Asked>
  void check_answers(Asked& asked, std::uint64_t first) {
    for (std::size_t i = 0; i < asked.size(); ++i) {
      std::uint64_t answer = 0;
      std::move(asked[i]).receive([&](std::uint64_t a) { answer = a; }, [&](caf::error& e) { FAIL(describe(e)); });
      CHECK(answer == first + i + 1);
    }
  }
  // The answer to a clock tick sent to `to`: its clock, or the error.
  caf::expected<std::uint64_t> tick(const caf::actor& to, std::uint64_t clock) {
    caf::expected<std::uint64_t> out{std::uint64_t{0}};
    asker->request(to, 10s, clock_atom::value, request_header{1, 0, clock, 7})
      .receive([&](std::uint64_t c) { out = c; }, [&](caf::error& e) { out = std::move(e); });
    return out;
  }
};

// Planes whose readers poll far longer than any answer here takes to come.
struct polling_planes : plane_fixture {
  polling_planes() : plane_fixture(10s) {}
};

// Sends each number it is sent to `to` as a clock tick (a tick of clock 0 is never
// answered, so no answer comes back while the test runs the actor).
struct relay_state {};
using relay_actor = batched_writes<caf::stateful_actor<relay_state, caf::event_based_actor>>;

caf::behavior relay(relay_actor* self, caf::actor to) {
  return {[=](std::uint64_t clock) {
    self->request(to, caf::infinite, clock_atom::value, request_header{1, 0, clock, 7}).then([](std::uint64_t) {});
  }};
}

}  // namespace

TEST_CASE_FIXTURE(plane_fixture, "plane messages: a batched_writes actor's requests for messages waiting in its "
                                 "mailbox leave in one write") {
  // The relay runs on CAF's deterministic coordinator, so its ten messages are waiting
  // when it runs; the plane it sends through has real sockets and threads.
  caf::actor_system_config test_cfg;
  test_cfg.set("scheduler.policy", caf::atom("testing"));
  caf::actor_system test_sys(init(test_cfg));
  auto& sched = dynamic_cast<caf::scheduler::test_coordinator&>(test_sys.scheduler());
  auto sender = std::make_unique<data_plane>("127.0.0.1", 1024, 10s, 10s);
  sender->enable_messages(test_sys);
  auto relay_to_target = test_sys.spawn(relay, connect_to(spawn_ticker(), *sender));
  sched.run();
  const auto writes_before = sender->socket_writes();
  for (std::uint64_t i = 0; i < 10; ++i) caf::anon_send(relay_to_target, std::uint64_t{0});
  sched.run();
  CHECK(sender->messages_sent() == 10);
  CHECK(sender->socket_writes() == writes_before + 1);
  CHECK(sender->requests_unanswered() == 10);
  sender.reset();  // first: the unsent answers it gives are delivered on this thread
  caf::anon_send_exit(relay_to_target, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(plane_fixture, "plane messages: a request through a proxy is answered over the data connection") {
  auto target = spawn_ticker();
  auto proxy = connect_to(target);
  CHECK(proxy.address() == target.address());  // it stands for the actor itself
  for (std::uint64_t c = 1; c <= 20; ++c) {
    auto answer = tick(proxy, c);
    REQUIRE_MESSAGE(answer, describe(answer.error()));
    CHECK(*answer == c + 1);
  }
  CHECK(worker->messages_sent() == 20);
  CHECK(server->messages_received() == 20);
  CHECK(server->messages_sent() == 20);
  CHECK(worker->messages_received() == 20);
  CHECK(worker->requests_unanswered() == 0);
}

TEST_CASE_FIXTURE(plane_fixture, "plane messages: the reader thread that reads a request runs the idle actor it "
                                 "wakes, and its answer still comes back") {
  auto proxy = connect_to(spawn_ticker());
  const auto runs_before = server->reader_runs();
  for (std::uint64_t c = 1; c <= 20; ++c) {
    auto answer = tick(proxy, c);
    REQUIRE_MESSAGE(answer, describe(answer.error()));
    CHECK(*answer == c + 1);
  }
  // Each tick found the ticker idle (only this reader feeds it, and it ran it to the end).
  CHECK(server->reader_runs() == runs_before + 20);
  CHECK(worker->reader_runs() == 0);  // the asker blocks: it is never woken through a runner
}

// Sums the values of a pushed block, claimed from `plane` (its payload frame came before
// the message on the same connection, so it has landed).
caf::behavior summer(caf::event_based_actor*, data_plane* plane) {
  return {
    [=](clock_atom, const request_header&, const float_block& b) -> caf::result<double> {
      auto values = claim_values(plane, b);
      if (!values) return caf::make_error(caf::sec::runtime_error, "the payload had not landed");
      double sum = 0;
      for (std::uint64_t i = 0; i < values->size; ++i) sum += values->data()[i];
      return sum;
    },
  };
}

TEST_CASE_FIXTURE(plane_fixture, "plane messages: a request whose payload nothing follows is summed on the reader "
                                 "thread that read it, not handed to the scheduler") {
  auto target = sys.spawn(summer, server.get());
  tickers.push_back(target);
  auto proxy = connect_to(target);
  const auto runs_before = server->reader_runs();
  const auto received_before = server->bytes_received();
  for (int i = 1; i <= 10; ++i) {
    auto named = worker->offload(server->token(), float_block::own(std::vector<float>(2048, static_cast<float>(i))));
    REQUIRE(named);  // 8 KiB: above the planes' 1 KiB, so it goes as a payload frame
    REQUIRE(named->ticket != 0);
    double sum = -1;
    asker->request(proxy, 10s, clock_atom::value, request_header{1, 0, 1, 7}, *named)
      .receive([&](double s) { sum = s; }, [&](caf::error& e) { FAIL(describe(e)); });
    CHECK(sum == 2048.0 * i);
  }
  CHECK(server->bytes_received() == received_before + 10 * 2048 * sizeof(float));
  // Each request found the summer idle and nothing behind its payload in the socket.
  CHECK(server->reader_runs() == runs_before + 10);
}

TEST_CASE_FIXTURE(polling_planes, "plane messages: readers that poll before they sleep get every answer right, "
                                  "and end with their planes") {
  auto proxy = connect_to(spawn_ticker());
  for (std::uint64_t c = 1; c <= 20; ++c) {
    auto answer = tick(proxy, c);
    REQUIRE_MESSAGE(answer, describe(answer.error()));
    CHECK(*answer == c + 1);
  }
  // How many answers polling found depends on what else ran meanwhile (a poller gives way
  // to any thread that wants its vCPU: test_libps, "busy poll"), so only a bound is sure.
  CHECK(worker->polled_reads() <= worker->messages_received() + 2);  // + hello, ring word
  // The fixture's planes end next, their readers polling for 10 s: their ends wake them.
}

TEST_CASE_FIXTURE(polling_planes, "plane messages: a plane stops polling and counts its host crowded while it has "
                                  "more peers on its host than CPUs beside it, and polls again once they leave") {
  connect_to(spawn_ticker());  // worker <-> server over loopback: one peer here each
  const auto cpus = std::max(1u, std::thread::hardware_concurrency());
  const auto wanted = std::chrono::microseconds(10s);
  CHECK(worker->poll_budget_now() == (cpus >= 2 ? wanted : 0us));
  CHECK(server->poll_budget_now() == (cpus >= 2 ? wanted : 0us));
  std::vector<std::unique_ptr<data_plane>> more;  // with the worker, cpus peers of the server's
  for (unsigned i = 1; i < cpus; ++i) {
    more.push_back(std::make_unique<data_plane>("127.0.0.1", 1024, 10s, 10s));
    std::string why;
    REQUIRE_MESSAGE(more.back()->connect(server->token(), "127.0.0.1", server->port(), &why), why);
  }
  // The server adds a connection when it accepts it: wait for the last (bounded).
  CHECK(within_10s([&] { return server->poll_budget_now() == 0us; }));
  CHECK(server->host_crowded());
  CHECK(worker->poll_budget_now() == (cpus >= 2 ? wanted : 0us));  // the worker's count is its own
  CHECK(worker->host_crowded() == (cpus < 2));
  more.clear();  // their connections end: the server drops them as its readers see the ends
  if (cpus >= 2) within_10s([&] { return server->poll_budget_now() != 0us; });  // checked just below
  CHECK(server->poll_budget_now() == (cpus >= 2 ? wanted : 0us));
  CHECK(server->host_crowded() == (cpus < 2));
}

TEST_CASE_FIXTURE(plane_fixture, "plane messages: a reader that does not poll never counts a polled read") {
  auto proxy = connect_to(spawn_ticker());
  for (std::uint64_t c = 1; c <= 5; ++c) REQUIRE(tick(proxy, c));
  CHECK(worker->polled_reads() == 0);
  CHECK(server->polled_reads() == 0);
}

TEST_CASE_FIXTURE(plane_fixture, "plane messages: frames sent while a write batch is open leave in one write when "
                                 "it lets go") {
  auto target = spawn_ticker();
  auto proxy = connect_to(target);
  const auto writes_before = worker->socket_writes();
  std::vector<decltype(asker->request(proxy, 10s, clock_atom::value, request_header{}))> asked;
  write_batch batch;
  {
    write_batch::scope open(batch);
    CHECK(write_batch::open() == &batch);
    for (std::uint64_t c = 1; c <= 10; ++c)
      asked.push_back(asker->request(proxy, 10s, clock_atom::value, request_header{1, 0, c, 7}));
  }
  CHECK(write_batch::open() == nullptr);
  CHECK(worker->messages_sent() == 10);
  CHECK(worker->socket_writes() == writes_before);  // held: no thread writes them meanwhile
  batch.release();
  CHECK(worker->socket_writes() == writes_before + 1);
  for (std::uint64_t c = 1; c <= 10; ++c) {
    std::uint64_t answer = 0;
    std::move(asked[c - 1]).receive([&](std::uint64_t a) { answer = a; }, [&](caf::error& e) { FAIL(describe(e)); });
    CHECK(answer == c + 1);
  }
}

TEST_CASE_FIXTURE(plane_fixture, "plane messages: what the served actor does not take over data connections is refused") {
  auto target = spawn_ticker();
  auto proxy = connect_to(target);
  std::string err;
  asker->request(proxy, 10s, data_atom::value)
    .receive([&](const std::string&) { err = "answered"; }, [&](caf::error& e) { err = describe(e); });
  CHECK(err.find("does not take this message") != std::string::npos);
  CHECK(server->messages_received() == 1);
}

TEST_CASE_FIXTURE(plane_fixture, "plane messages: a request to an actor not served there (it ended) is answered "
                                 "receiver down, as CAF answers for a dead actor") {
  auto target = spawn_ticker();
  connect_to(target);
  auto gone = caf::actor_cast<caf::actor>(worker->proxy(server->token(), target.id() + 1000, target.node()));
  REQUIRE(gone);
  auto answer = tick(gone, 5);
  REQUIRE(!answer);
  CHECK(answer.error() == caf::sec::request_receiver_down);
}

TEST_CASE_FIXTURE(plane_fixture, "plane messages: a request whose connection ends is answered unsent at once, and "
                                 "one without a connection too") {
  auto target = spawn_ticker();
  auto proxy = connect_to(target);
  auto start = std::chrono::steady_clock::now();
  caf::error err;
  auto held = asker->request(proxy, 30s, clock_atom::value, request_header{1, 0, 0, 7});  // never answered
  CHECK(worker->requests_unanswered() == 1);  // noted as it was written
  std::thread end_server([&] { server.reset(); });  // its connections close
  std::move(held).receive([&](std::uint64_t) {}, [&](caf::error& e) { err = std::move(e); });
  end_server.join();
  CHECK(code_of(err) == errc::unsent);
  CHECK(describe(err).find("ended") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < 10s);  // not the request's 30 s
  CHECK(worker->requests_unanswered() == 0);
  // The proxy outlives its connection: what is sent to it is answered unsent at once.
  auto again = tick(proxy, 5);
  REQUIRE(!again);
  CHECK(code_of(again.error()) == errc::unsent);
  CHECK(describe(again.error()).find("no data connection") != std::string::npos);
}

TEST_CASE("plane messages: a message frame to a side that takes none closes the connection") {
  data_plane server("127.0.0.1", 1024, 10s, 10s);  // messages not enabled
  int fd = test::raw_connection(server);
  auto hello = encode_bulk_header({bulk_kind::hello, 0x5eed, 0});
  auto message = encode_bulk_header({bulk_kind::message, 0, 8});
  char body[8] = {};
  test::write_bytes(fd, hello.data(), hello.size());
  test::write_bytes(fd, message.data(), message.size());
  test::write_bytes(fd, body, sizeof body);
  char byte;
  CHECK(::recv(fd, &byte, 1, 0) == 0);  // closed (the plane logs why)
  ::close(fd);
}

namespace {

// Answers ticks; a tick of clock 99 ends it, and with it the share of `plane` it holds.
caf::behavior plane_holder(caf::event_based_actor* self, std::shared_ptr<data_plane> plane) {
  return {[=](clock_atom, const request_header& h) -> std::uint64_t {
    if (h.clock == 99) self->quit();
    return plane ? h.clock + 1 : 0;
  }};
}

}  // namespace

TEST_CASE("plane messages: a shared plane whose last owner lets go on the plane's own reader thread ends there "
          "without joining that thread") {
  caf::actor_system_config cfg;
  caf::actor_system sys(plane_fixture::init(cfg));
  auto server = data_plane::shared(std::make_unique<data_plane>("127.0.0.1", 1024, 10s, 10s));
  auto worker = std::make_unique<data_plane>("127.0.0.1", 1024, 10s, 10s);
  server->enable_messages(sys);
  worker->enable_messages(sys);
  caf::scoped_actor asker{sys};
  worker->serve(caf::actor_cast<caf::strong_actor_ptr>(asker),
                [](caf::message_id mid, const caf::message&) { return mid.is_response(); });
  auto holder = sys.spawn(plane_holder, server);
  server->serve(caf::actor_cast<caf::strong_actor_ptr>(holder), [](caf::message_id mid, const caf::message&) {
    return mid.is_request();
  });
  std::string why;
  REQUIRE_MESSAGE(worker->connect(server->token(), "127.0.0.1", server->port(), &why), why);
  REQUIRE(worker->takes_messages(server->token(), 5s));
  auto proxy = caf::actor_cast<caf::actor>(worker->proxy(server->token(), holder.id(), holder.node()));
  REQUIRE(proxy);
  auto tick = [&](std::uint64_t clock) {
    std::uint64_t answer = 0;
    asker->request(proxy, 10s, clock_atom::value, request_header{1, 0, clock, 7})
      .receive([&](std::uint64_t c) { answer = c; }, [&](caf::error&) {});
    return answer;
  };
  CHECK(tick(1) == 2);
  std::weak_ptr<data_plane> gone = server;
  server.reset();  // the holder's share is the last: it ends with the holder, on the reader that runs it
  CHECK(tick(99) == 100);
  holder = nullptr;
  CHECK(within_10s([&] { return gone.expired(); }));
}

namespace {

// Whether the plane's readers all came to wait for bytes within 10 s (a reader goes back
// to its socket once it delivered what came).
bool readers_asleep(const data_plane& plane) {
  return within_10s([&] { return plane.readers_awake() == 0; });
}

}  // namespace

TEST_CASE_FIXTURE(plane_fixture, "plane messages: a lingering write batch writes at once when its connection's reader "
                                 "sleeps and no answer is due there") {
  auto proxy = connect_to(spawn_ticker());
  REQUIRE(tick(proxy, 1));
  REQUIRE(readers_asleep(*worker));
  const auto writes_before = worker->socket_writes();
  write_batch batch(true);
  auto asked = ticks_in_batch(batch, proxy, 2, 4);
  CHECK(worker->socket_writes() == writes_before);
  batch.release();
  CHECK(worker->socket_writes() == writes_before + 1);  // nothing would have woken a reader for them
  check_answers(asked, 2);
}

TEST_CASE_FIXTURE(plane_fixture, "plane messages: a lingering write batch keeps its frames while an answer is due on "
                                 "their connection, until its thread flushes them; then they leave in one write") {
  auto proxy = connect_to(spawn_ticker());
  [[maybe_unused]] auto unanswered =
      asker->request(proxy, 10s, clock_atom::value, request_header{1, 0, 0, 7});  // clock 0: never answered
  REQUIRE(within_10s([&] { return worker->requests_unanswered() == 1; }));
  REQUIRE(readers_asleep(*worker));
  const auto writes_before = worker->socket_writes();
  write_batch batch(true);
  auto asked = ticks_in_batch(batch, proxy, 1, 3);
  batch.release();
  CHECK(worker->socket_writes() == writes_before);  // lingering: the held tick's answer would wake the reader
  CHECK(worker->requests_unanswered() == 4);
  batch.flush_lingering();
  CHECK(worker->socket_writes() == writes_before + 1);
  check_answers(asked, 1);
}
