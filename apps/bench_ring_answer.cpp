// bench_ring_answer: one answer through a shared-memory ring, as a shard sends a pull's
// answer to a worker on its host, timed from the offload to the claim that has it in
// place. Two data planes in this process, connected over loopback with rings both ways.
// Each round sends every size twice, streamed (header first, the receiver copying out as
// the sender copies in) and floats first (all of it in the ring, then the header), so
// the two ways take turns and a VM whose speed drifts moves both alike (BENCHMARKS.md,
// "Answers stream through their ring"). JSON lines: one per size and way, and the
// single-thread memcpy limit of the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "actors/data_plane.hpp"
#include "apps/bench_timing.hpp"
#include "apps/tcp_limit.hpp"

using namespace std::chrono_literals;

namespace {

struct options {
  int rounds = 300;
  std::chrono::microseconds busy_poll{200};  // --ps.busy-poll-us's default
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      auto prefix = std::string(name) + "=";
      return a.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    char* end = nullptr;
    if (auto v = value("--rounds")) o.rounds = static_cast<int>(std::strtol(v, &end, 10));
    else if (auto v = value("--busy-poll-us")) o.busy_poll = std::chrono::microseconds(std::strtol(v, &end, 10));
    else {
      std::fprintf(stderr, "bench_ring_answer: unknown flag '%s' (takes --rounds=N, --busy-poll-us=N)\n", argv[i]);
      std::exit(2);
    }
    if (!end || *end != '\0' || o.rounds < 1 || o.busy_poll.count() < 0) {
      std::fprintf(stderr, "bench_ring_answer: '%s' needs a whole number (rounds at least 1)\n", argv[i]);
      std::exit(2);
    }
  }
  return o;
}

double percentile(std::vector<double> t, double q) {
  std::sort(t.begin(), t.end());
  return t[static_cast<std::size_t>(q * static_cast<double>(t.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  const auto opts = parse(argc, argv);
  const std::size_t ring = 8u << 20;  // --ps.shm-ring-bytes's default
  ps::data_plane worker("127.0.0.1", 1024, 10s, 10s, std::nullopt, ring, opts.busy_poll);
  ps::data_plane server("127.0.0.1", 1024, 10s, 10s, std::nullopt, ring, opts.busy_poll);
  std::string why;
  if (!worker.connect(server.token(), "127.0.0.1", server.port(), &why)) {
    std::fprintf(stderr, "bench_ring_answer: %s\n", why.c_str());
    return 1;
  }
  // A push first: the server's ring is answered before it (the connection keeps order).
  auto warm = ps::float_block::own(std::vector<float>(1 << 18, 1.0f));
  server.claim(*worker.offload(server.token(), warm));
  std::uint64_t ticket = 0;
  for (std::size_t bytes : {std::size_t{1} << 20, std::size_t{4} << 20}) {
    const auto count = bytes / sizeof(float);
    std::vector<float> values(count, 2.0f);
    auto dest = std::make_shared<std::vector<float>>(count);
    std::vector<double> took[2];  // [1]: streamed
    for (int round = 0; round < opts.rounds; ++round)
      for (int streamed = 0; streamed < 2; ++streamed) {
        server.stream_answers_above(streamed ? 0 : ~std::uint64_t{0});
        std::span<const float> whole{values.data(), count};
        worker.expect(server.token(), ++ticket, {{dest->data(), count}}, dest);
        const auto start = std::chrono::steady_clock::now();
        auto sent = server.offload(worker.token(), std::span(&whole, 1), count, ticket, nullptr);
        if (!sent || !server.sends_by_ring(worker.token())) {
          std::fprintf(stderr, "bench_ring_answer: the answer did not go through the ring\n");
          return 1;
        }
        worker.claim(*sent);
        took[streamed].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
        worker.forget(server.token(), ticket);
      }
    for (int streamed = 0; streamed < 2; ++streamed)
      ps::bench::print_line({{"bytes", bytes}, {"way", streamed ? "streamed" : "floats_first"},
                             {"rounds", opts.rounds}, {"p50_us", percentile(took[streamed], 0.5)},
                             {"p90_us", percentile(took[streamed], 0.9)},
                             {"gbps", static_cast<double>(bytes) / percentile(took[streamed], 0.5) / 1e3}});
  }
  auto copy = ps::measure_memcpy(4u << 20, 0.5);
  ps::bench::print_line({{"limit", "memcpy"}, {"gbps", copy.gbps}, {"bytes", 4u << 20}});
}
