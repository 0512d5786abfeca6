// The bench app (bench_kv): push/pull throughput and latency per (size, window).
#include "apps/apps.hpp"
#include "apps/app_common.hpp"
#include "apps/ctr_app.hpp"
#include "apps/rowcheck.hpp"
#include "apps/elastic_load.hpp"
#include "apps/sparse_bench.hpp"
#include "apps/tcp_limit.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <random>
#include <sstream>

#include "actors/gpu_aggregator.hpp"
#include "libps/observe/log.hpp"
#include "libps/observe/progress.hpp"
#include "actors/training.hpp"
#include "apps/fmnist_data.hpp"
#include "runtime/job_contract.hpp"

namespace ps {

namespace {

// Each worker has its own tensor, so 2 workers do not contend for one key.
key_type bench_base(std::uint32_t worker) { return key_type{worker + 1} << 36; }

// What one worker's cells of one size share: the keys, the pushed values and the buffers
// that pulls land in.
struct bench_tensor {
  key_set keys;
  std::shared_ptr<std::vector<float>> payload;  // shared, not copied per op
  std::deque<std::vector<float>> spare;
  bool rotate = false;
};

// Pull results land in buffers made before the cells, as a training loop makes its
// model's once: fresh memory costs more than the transfer here (kv_client::pull).
// The one used last goes again (window 1: always the same, warm in cache), or with
// --pull-buffers=N they take turns, N at least (window 1 then writes cold memory as
// window 8 does: BENCHMARKS.md, "16 MiB pulls at window 8").
bench_tensor make_bench_tensor(worker_context& ctx, std::int64_t bytes, const std::vector<std::int64_t>& windows) {
  key_type base = bench_base(ctx.id);
  auto n = static_cast<std::uint64_t>(bytes) / sizeof(float);
  bench_tensor t{key_set::single({base, base + n}), std::make_shared<std::vector<float>>(n, 1.0f), {},
                 ctx.cfg.app_count("pull-buffers") > 0};
  ctx.kv.push(t.keys, t.payload).get();  // creates the keys (sum rule: overlaps are fine)
  const auto largest_window = static_cast<std::size_t>(*std::max_element(windows.begin(), windows.end()));
  const auto buffers = std::max(largest_window, ctx.cfg.app_count("pull-buffers"));
  while (t.spare.size() < buffers) t.spare.emplace_back(n);
  return t;
}

// One measured cell: `window` requests of `op` kept in flight for --cell-seconds.
bench_cell run_bench_cell(worker_context& ctx, bench_tensor& t, const std::string& op, std::uint64_t window) {
  bench_cell cell{op, t.payload->size() * sizeof(float), window, ctx.id, 0, 0, {}, 0};
  std::deque<std::pair<kv_future, clock_type::time_point>> inflight;
  // A request's latency runs from the call that makes it to the caller holding its result:
  // stamped before the call, which may run the client actor (and send) on this thread.
  auto issue = [&] {
    const auto called = clock_type::now();
    kv_future f;
    if (op == "push") {
      f = ctx.kv.push(t.keys, t.payload);
    } else {
      auto& from = t.spare;
      f = ctx.kv.pull(t.keys, std::move(t.rotate ? from.front() : from.back()));
      t.rotate ? from.pop_front() : from.pop_back();
    }
    inflight.emplace_back(std::move(f), called);
  };
  auto done = [&](kv_future& f) {
    auto values = f.get();
    if (op == "pull") t.spare.push_back(std::move(values));
  };
  // Untimed first: two windows of requests, so the cell measures the steady state, not
  // the first use of this window's buffers and connections (BENCHMARKS.md: the same
  // window-8 cell run twice moved 2.0 then 4.8 GB/s).
  for (std::uint64_t i = 0; i < 2 * window; ++i) {
    if (inflight.size() == window) {
      done(inflight.front().first);
      inflight.pop_front();
    }
    issue();
  }
  for (auto& [f, t0] : inflight) done(f);
  inflight.clear();
  auto start = clock_type::now();
  while (seconds_since(start) < ctx.cfg.app_number("cell-seconds") || cell.ops < 4) {
    while (inflight.size() < window) issue();
    auto [f, t0] = std::move(inflight.front());
    inflight.pop_front();
    done(f);
    cell.latencies_us.push_back(seconds_since(t0) * 1e6);
    ++cell.ops;
  }
  // Up to the last counted answer: the requests still in flight were sent in that time
  // as the first ones were sent into an empty pipeline after `start`, so the two
  // balance; timing the drain too charged a window of uncounted transfers to the
  // cell (64 MiB at window 8 over 0.5 s: about 12 ops counted, 7 more timed).
  cell.seconds = seconds_since(start);
  for (auto& [f, t0] : inflight) done(f);  // drain, not counted
  return cell;
}

// Per size, --rounds times: every window's push then pull, so the windows of a size are
// measured side by side and a VM whose speed drifts moves them alike.
std::string bench_app(worker_context& ctx) {
  auto sizes = bench_sizes(ctx.cfg), windows = bench_windows(ctx.cfg);
  const auto rounds = ctx.cfg.app_count("rounds");
  for (auto bytes : sizes) {
    auto tensor = make_bench_tensor(ctx, bytes, windows);
    for (std::uint64_t round = 0; round < rounds; ++round) {
      // The limits beside the cells they are compared with, while the other workers wait:
      // this VM's speed drifts within a minute, so limits taken at the start of a run
      // could be half or twice what the cells saw.
      ctx.barrier();
      double tcp_limit = 0, copy_limit = 0;
      if (ctx.id == 0) {
        const auto limit_bytes = static_cast<std::uint64_t>(bench_limit_bytes(ctx.cfg));
        // At most 1.25 s in all, whatever --cell-seconds (tools/bench_cell_start.sh waits that).
        const auto seconds = ctx.cfg.app_number("cell-seconds");
        tcp_limit = measure_tcp_loopback(limit_bytes, 8, std::min(1.0, seconds), ctx.cfg.tcp_congestion).gbps;
        copy_limit = measure_memcpy(limit_bytes, std::min(0.25, seconds)).gbps;
      }
      for (auto window : windows)
        for (std::string op : {"push", "pull"}) {
          ctx.barrier();
          auto cell = run_bench_cell(ctx, tensor, op, static_cast<std::uint64_t>(window));
          cell.round = round;
          cell.tcp_limit_gbps = tcp_limit;
          cell.memcpy_gbps = copy_limit;
          ctx.report(cell.encode());
        }
    }
  }
  ctx.barrier();
  return with_data_plane({{"worker", ctx.id}}, ctx);
}

std::vector<tensor_spec> bench_tensors(const node_config& cfg) {
  std::vector<tensor_spec> out;
  std::int64_t largest = 0;
  for (auto b : bench_sizes(cfg)) largest = std::max(largest, b);
  auto n = static_cast<std::uint64_t>(largest) / sizeof(float);
  for (std::uint32_t w = 0; w < cfg.workers; ++w) {
    auto base = bench_base(w);
    out.push_back({"bench.worker" + std::to_string(w), {base, base + n}, {n}});
  }
  return out;
}

std::vector<app_flag> bench_flags() {
  auto each = [](const char* name, auto ok, const char* what) {
    return [=](const node_config& c) -> std::string {
      for (auto v : c.app_counts(name))
        if (!ok(v)) return std::to_string(v) + " " + what;
      return "";
    };
  };
  return {{"sizes", app_flag_kind::counts, "[]", "bench_kv: value sizes in bytes, e.g. [4096,1048576]",
           each("sizes", [](std::int64_t s) { return s >= 4 && s % 4 == 0; }, "is not a positive multiple of 4 bytes")},
          {"windows", app_flag_kind::counts, "[]", "bench_kv: requests in flight, e.g. [1,8]",
           each("windows", [](std::int64_t w) { return w >= 1 && w <= 1024; }, "is not in [1, 1024]")},
          {"pull-buffers", app_flag_kind::count, "0",
           "bench_kv: 0: a pull lands in the buffer used last (window 1 reuses one, warm); N: pulls take turns "
           "over max(N, window) buffers",
           {}},
          {"rounds", app_flag_kind::count, "1",
           "bench_kv: times each size's cells are measured, every window in turn (a drifting VM then moves the "
           "windows alike); a row carries the median and each round's gbps",
           [](const node_config& c) { return c.app_count("rounds") >= 1 ? "" : "must be >= 1"; }},
          {"cell-seconds", app_flag_kind::number, "0.5", "bench_kv: seconds per measured cell",
           [](const node_config& c) { return c.app_number("cell-seconds") > 0 ? "" : "must be > 0"; }},
          {"transport", app_flag_kind::text, "both", "bench_kv: tcp, shm (shared memory between processes) or both",
           [](const node_config& c) -> std::string {
             auto t = c.app_text("transport");
             return t == "tcp" || t == "shm" || t == "both" ? "" : "must be tcp, shm or both";
           }}};
}

}  // namespace

std::vector<std::int64_t> bench_sizes(const node_config& cfg) {
  auto sizes = cfg.app_counts("sizes");
  if (sizes.empty()) sizes = {4096, 65536, 1 << 20, 16 << 20, 64 << 20};
  return sizes;
}

std::vector<std::int64_t> bench_windows(const node_config& cfg) {
  auto windows = cfg.app_counts("windows");
  if (windows.empty()) windows = {1, 8};
  return windows;
}

std::int64_t bench_limit_bytes(const node_config& cfg) {
  auto sizes = bench_sizes(cfg);
  std::int64_t limit_bytes = 0;
  for (auto s : sizes)
    if (s <= (16 << 20)) limit_bytes = std::max(limit_bytes, s);
  return limit_bytes != 0 ? limit_bytes : *std::min_element(sizes.begin(), sizes.end());
}

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(bench_cell, op, bytes, window, worker, ops, seconds, latencies_us, round,
                                   tcp_limit_gbps, memcpy_gbps)

std::string bench_cell::encode() const { return encode_cell(*this); }
bench_cell bench_cell::decode(const std::string& text) { return decode_cell<bench_cell>(text, "a bench cell report"); }

app_definition bench_definition() {
  return {"bench", "push/pull throughput per size and window (bench_kv)", bench_app, "sum", "asp", bench_tensors,
          bench_flags()};
}

}  // namespace ps
