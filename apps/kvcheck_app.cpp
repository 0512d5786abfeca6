// The kvcheck app: exact sums under asynchronous pushes, and which way the requests went.
#include "apps/apps.hpp"
#include "apps/app_common.hpp"
#include "apps/ctr_app.hpp"
#include "actors/transport.hpp"
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

// ---- kvcheck: exact sums under asynchronous pushes (ps-lite's test_kv_app) ----------

// What a worker's data plane carried so far, and the requests its client sent through CAF.
struct plane_counts {
  std::uint64_t caf_requests = 0, requests = 0, sent = 0, received = 0;
};

plane_counts data_plane_counts(worker_context& ctx) {
  plane_counts c;
  c.caf_requests = ctx.kv.requests_through_caf();
  if (const auto& plane = ctx.kv.options().plane) {
    auto moved = plane->counters();
    c.requests = moved.messages_sent;
    c.sent = moved.bytes_sent;
    c.received = moved.bytes_received;
  }
  return c;
}

// Tensors of many sizes: 10^5 one-float keys spread out (each its own range), then
// contiguous tensors from 7 floats to 6 MiB.
struct tensor_layout {
  std::vector<key_range> ranges;
  std::uint64_t num_keys = 0;
};

tensor_layout kvcheck_layout(key_type base) {
  tensor_layout t;
  key_type k = base;
  for (int i = 0; i < 100000; ++i, k += 3) t.ranges.push_back({k, k + 1});
  for (std::uint64_t n : {7ull, 4096ull, 5000ull, 262144ull, 1572864ull}) {
    k += 1000;
    t.ranges.push_back({k, k + n});
    k += n;
  }
  for (const auto& r : t.ranges) t.num_keys += r.size();
  return t;
}

constexpr key_type kvcheck_own_stride = key_type{1} << 32;  // worker w's own keys start at (w+1) << 32

// An integer value for (key, worker, round): sums stay exact in float.
float kv_value(key_type key, std::uint32_t worker, int round) {
  return static_cast<float>((key % 13) + 1 + worker * 3 + round);
}

// Worker w's values for round `round`, key by key of t.
std::vector<float> values_for(const tensor_layout& t, std::uint32_t w, int round) {
  std::vector<float> v;
  v.reserve(t.num_keys);
  for (const auto& r : t.ranges)
    for (key_type k = r.begin; k < r.end; ++k) v.push_back(kv_value(k, w, round));
  return v;
}

// Pulled sums checked against every round of their pushers' values.
struct kvcheck_tally {
  int rounds;
  std::uint64_t checked = 0, mismatches = 0;
  std::string first{};  // the first mismatch

  void check(kv_client& kv, const tensor_layout& t, const std::vector<std::uint32_t>& pushers) {
    auto got = kv.pull(key_set(t.ranges)).get();
    std::size_t i = 0;
    for (const auto& r : t.ranges)
      for (key_type k = r.begin; k < r.end; ++k, ++i) {
        double expect = 0;
        for (auto w : pushers)
          for (int round = 0; round < rounds; ++round) expect += kv_value(k, w, round);
        ++checked;
        if (got[i] != expect && mismatches++ == 0)
          first = "key " + std::to_string(k) + ": got " + std::to_string(got[i]) + ", expected " + std::to_string(expect);
      }
  }
};

std::string kvcheck_app(worker_context& ctx) {
  constexpr int rounds = 10;
  auto shared = kvcheck_layout(0);
  auto own = [&](std::uint32_t w) { return kvcheck_layout((w + 1) * kvcheck_own_stride); };
  auto mine = own(ctx.id);
  auto push_rounds = [&](int first, int end) {  // all in flight at once
    std::vector<kv_future> inflight;
    for (int round = first; round < end; ++round) {
      inflight.push_back(ctx.kv.push(key_set(shared.ranges), values_for(shared, ctx.id, round)));
      inflight.push_back(ctx.kv.push(key_set(mine.ranges), values_for(mine, ctx.id, round)));
    }
    for (auto& f : inflight) f.get();
  };
  // The first half may leave before the data connections are up (through CAF, then over
  // them as they come up); the second half and the checks leave after they are, so
  // "after_connections" counts what the data plane must carry, however fast the job runs.
  push_rounds(0, rounds / 2);
  const auto connections = ctx.kv.await_data_connections(std::chrono::milliseconds(ctx.cfg.timeout_ms));
  const auto before = data_plane_counts(ctx);
  push_rounds(rounds / 2, rounds);
  ctx.barrier();
  kvcheck_tally tally{rounds};
  std::vector<std::uint32_t> all;
  for (std::uint32_t w = 0; w < ctx.num_workers; ++w) all.push_back(w);
  tally.check(ctx.kv, shared, all);
  for (std::uint32_t w = 0; w < ctx.num_workers; ++w) tally.check(ctx.kv, own(w), {w});
  const auto after = data_plane_counts(ctx);
  ctx.barrier();  // nobody leaves while others still pull
  json_line out{{"worker", ctx.id}, {"checked", tally.checked}, {"mismatches", tally.mismatches},
                {"keys_per_push", shared.num_keys}, {"first_mismatch", tally.first}};
  if (ctx.kv.options().plane) {
    out["data_connections"] = connections;
    out["after_connections"] = {{"rounds", rounds - rounds / 2},
                                {"requests_through_caf", after.caf_requests - before.caf_requests},
                                {"data_plane_requests", after.requests - before.requests},
                                {"data_plane_sent", after.sent - before.sent},
                                {"data_plane_received", after.received - before.received}};
  }
  return with_data_plane(std::move(out), ctx);
}

// The dense tensors an app's workers push and pull, for the job spec: the one-float keys
// spread out lie in one tensor that spans them, each contiguous range is one.
std::vector<tensor_spec> contiguous_tensors(const std::string& prefix, const tensor_layout& t) {
  std::vector<tensor_spec> out;
  auto singles = std::find_if(t.ranges.begin(), t.ranges.end(), [](const key_range& r) { return r.size() > 1; });
  if (singles != t.ranges.begin()) {
    key_range spread{t.ranges.front().begin, std::prev(singles)->end};
    out.push_back({prefix + "@" + std::to_string(spread.begin), spread, {spread.size()}});
  }
  for (auto it = singles; it != t.ranges.end(); ++it)
    out.push_back({prefix + "@" + std::to_string(it->begin), *it, {it->size()}});
  return out;
}

std::vector<tensor_spec> kvcheck_tensors(const node_config& cfg) {
  auto out = contiguous_tensors("shared", kvcheck_layout(0));
  for (std::uint32_t w = 0; w < cfg.workers; ++w) {
    auto own = contiguous_tensors("worker" + std::to_string(w), kvcheck_layout((w + 1) * kvcheck_own_stride));
    out.insert(out.end(), own.begin(), own.end());
  }
  return out;
}

}  // namespace

app_definition kvcheck_definition() {
  return {"kvcheck", "exact sums under asynchronous pushes", kvcheck_app, "sum", "asp", kvcheck_tensors, {}};
}

}  // namespace ps
