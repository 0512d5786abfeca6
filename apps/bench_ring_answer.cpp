// bench_ring_answer: one answer through a shared-memory ring, as a shard sends a pull's
// answer to a worker on its host, timed from the offload to the claim that has it in
// place. Two data planes in this process, connected over loopback with rings both ways.
// Each round sends every size twice, streamed (header first, the receiver copying out as
// the sender copies in) and floats first (all of it in the ring, then the header), so
// the two ways take turns and a VM whose speed drifts moves both alike (BENCHMARKS.md,
// "Answers stream through their ring"; bench_timing.hpp's interleaved). JSON lines: one per
// size and way, and the single-thread memcpy limit of the same run.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "actors/data_plane.hpp"
#include "apps/bench_timing.hpp"
#include "apps/tcp_limit.hpp"
#include "libps/observe/text.hpp"

using namespace std::chrono_literals;

namespace {

struct options {
  int rounds = 300;
  std::chrono::microseconds busy_poll{200};  // --ps.busy-poll-us's default
};

options parse(int argc, char** argv) {
  options o;
  for (const auto& arg : ps::split_flags(argc, argv)) {
    const auto& flag = arg.name;
    const auto v = arg.value.value_or("");
    auto count = ps::parse_count(v);
    if (flag != "--rounds" && flag != "--busy-poll-us")
      throw ps::bad_request("unknown flag '" + arg.text + "' (takes --rounds=N, --busy-poll-us=N)");
    if (!count || (flag == "--rounds" && *count < 1))
      throw ps::bad_request(flag + ": \"" + v + "\" is not a count" + (flag == "--rounds" ? " of at least 1" : ""));
    if (flag == "--rounds") o.rounds = static_cast<int>(*count);
    else o.busy_poll = std::chrono::microseconds(*count);
  }
  return o;
}

// Each round one answer of `bytes` each way, floats first then streamed; JSON lines of
// their median times.
void answer_cells(ps::data_plane& worker, ps::data_plane& server, std::size_t bytes, int rounds) {
  const auto count = bytes / sizeof(float);
  std::vector<float> values(count, 2.0f);
  auto dest = std::make_shared<std::vector<float>>(count);
  std::uint64_t ticket = bytes;  // tickets of one size do not meet another's
  auto answer = [&](std::uint64_t above) {
    server.stream_answers_above(above);
    std::span<const float> whole{values.data(), count};
    worker.expect(server.token(), ++ticket, {{dest->data(), count}}, dest);
    auto sent = server.offload(worker.token(), std::span(&whole, 1), count, ticket, nullptr);
    if (!sent || !server.sends_by_ring(worker.token()))
      throw ps::bad_request("the answer did not go through the ring");
    worker.claim(*sent);
    worker.forget(server.token(), ticket);
  };
  std::vector<double> streamed_all;
  auto [floats_first, streamed] =
      ps::bench::interleaved(rounds, [&] { answer(~std::uint64_t{0}); }, [&] { answer(0); }, streamed_all);
  for (auto [way, seconds] : {std::pair{"floats_first", floats_first}, std::pair{"streamed", streamed}})
    ps::bench::print_line({{"bytes", bytes}, {"way", way}, {"rounds", rounds}, {"p50_us", seconds * 1e6},
                           {"gbps", static_cast<double>(bytes) / seconds / 1e9}});
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto opts = parse(argc, argv);
    const std::size_t ring = 8u << 20;  // --ps.shm-ring-bytes's default
    ps::data_plane worker("127.0.0.1", 1024, 10s, 10s, std::nullopt, ring, opts.busy_poll);
    ps::data_plane server("127.0.0.1", 1024, 10s, 10s, std::nullopt, ring, opts.busy_poll);
    std::string why;
    if (!worker.connect(server.token(), "127.0.0.1", server.port(), &why)) throw ps::bad_request(why);
    // A push first: the server's ring is answered before it (the connection keeps order).
    auto warm = ps::float_block::own(std::vector<float>(1 << 18, 1.0f));
    server.claim(*worker.offload(server.token(), warm));
    for (std::size_t bytes : {std::size_t{1} << 20, std::size_t{4} << 20}) answer_cells(worker, server, bytes, opts.rounds);
    auto copy = ps::measure_memcpy(4u << 20, 0.5);
    ps::bench::print_line({{"limit", "memcpy"}, {"gbps", copy.gbps}, {"bytes", 4u << 20}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ring_answer: %s\n", e.what());
    return 2;
  }
}
