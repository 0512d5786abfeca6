// elastic: sustained load for bench_elastic. Each worker pushes 1 to every key of a 1 MiB
// tensor and pulls it back, one request of each at a time, for --load-seconds; it records
// when each push and pull ended (steady clock, the same on every process of a host) and
// how long it took. Then all workers pull the sums: every key must hold the number of
// pushes of all workers, so a lost or doubled update shows.
#include "apps/elastic_load.hpp"

#include <chrono>
#include <numeric>

#include "apps/apps.hpp"

namespace ps {

namespace {

constexpr std::uint64_t elastic_keys = 1u << 18;  // 1 MiB of floats

std::int64_t micros(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

std::string elastic_app(worker_context& ctx) {
  using clock = std::chrono::steady_clock;
  auto keys = key_set::single({0, elastic_keys});
  auto ones = std::make_shared<std::vector<float>>(elastic_keys, 1.0f);
  std::vector<float> into(elastic_keys);
  std::vector<std::int64_t> ends_us, took_us;
  std::uint64_t pushes = 0;
  auto timed = [&](auto request) {
    auto start = clock::now();
    request();
    auto end = clock::now();
    ends_us.push_back(micros(end));
    took_us.push_back(micros(end) - micros(start));
  };
  ctx.report("load started");
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(
                                         std::chrono::duration<double>(ctx.cfg.app_number("load-seconds")));
  while (clock::now() < deadline) {
    timed([&] { ctx.kv.push(keys, ones).get(); });
    ++pushes;
    timed([&] { into = ctx.kv.pull(keys, std::move(into)).get(); });
  }
  ctx.kv.leave_clock_vector().get();
  ctx.barrier();  // every worker's pushes are in
  auto sums = ctx.kv.pull(keys).get();
  ctx.barrier();  // nobody leaves while others still pull
  double total = std::accumulate(sums.begin(), sums.end(), 0.0);
  return nlohmann::json{{"worker", ctx.id},   {"pushes", pushes}, {"keys", elastic_keys},
                        {"final_sum", total}, {"ends_us", ends_us}, {"took_us", took_us}}
    .dump();
}

}  // namespace

app_definition elastic_load_definition() {
  app_definition app{"elastic", "sustained push/pull load with exact sums (bench_elastic)", elastic_app, "sum", "asp",
                     [](const node_config&) {
                       return std::vector<tensor_spec>{{"elastic", {0, elastic_keys}, {elastic_keys}}};
                     },
                     {}};
  app.flags = {{"load-seconds", app_flag_kind::number, "9", "elastic: seconds of load per worker",
                [](const node_config& c) { return c.app_number("load-seconds") > 0 ? "" : "must be > 0"; }}};
  return app;
}

}  // namespace ps
