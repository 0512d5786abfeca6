#include "apps/apps.hpp"
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
#include "libps/log.hpp"
#include "libps/progress.hpp"
#include "actors/training.hpp"
#include "apps/fmnist_data.hpp"
#include "runtime/job_contract.hpp"

namespace ps {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// ---- fmnist: data-parallel training with the parameters on the servers -------------

// Parameters worker 0 saw at a moment of training, for time-to-accuracy afterwards
// (evaluating during training would steal the CPU the run is timed on).
struct snapshot {
  double seconds;
  std::vector<float> params;
};

// The first snapshot whose test accuracy reaches target: every 4th is evaluated until
// one does, then the ones before it (accuracy rises nearly monotonically). -1: never.
double seconds_to_target(const fmnist::model& model, const std::vector<snapshot>& snaps,
                         const fmnist::dataset& test, double target) {
  auto reaches = [&](std::size_t i) { return fmnist::accuracy(model, snaps[i].params, test) >= target; };
  constexpr std::size_t stride = 4;
  for (std::size_t hi = 0; hi < snaps.size(); hi += stride) {
    auto probe = std::min(hi + stride - 1, snaps.size() - 1);
    if (!reaches(probe)) continue;
    for (std::size_t i = hi; i < probe; ++i)
      if (reaches(i)) return snaps[i].seconds;
    return snaps[probe].seconds;
  }
  return -1;
}

// Loader stage: this worker's share of the training set (every k-th sample, k the number
// of running workers, taken anew at each epoch start, so a dead worker's samples go to the
// survivors and a worker that joined gets its part), reshuffled per worker and epoch.
batch_loader fmnist_loader(worker_context& ctx, const fmnist::dataset& train, std::size_t iters_per_epoch,
                           std::size_t batch) {
  auto share_of = [&ctx, &train](const std::vector<std::uint32_t>& live) {
    std::size_t k = std::max<std::size_t>(1, live.size());
    auto rank = static_cast<std::size_t>(std::find(live.begin(), live.end(), ctx.id) - live.begin()) % k;
    std::vector<std::size_t> out;
    for (std::size_t i = rank; i < train.count; i += k) out.push_back(i);
    return out;
  };
  return batch_loader(ctx.sys, [&ctx, &train, share_of, iters_per_epoch, batch, order = std::vector<std::size_t>{},
                                order_epoch = UINT64_MAX](std::uint64_t clock) mutable {
    const auto features = train.features;
    auto it = clock % iters_per_epoch;
    if (auto epoch = clock / iters_per_epoch; epoch != order_epoch) {
      order = share_of(ctx.kv.live_workers());
      std::mt19937_64 rng(ctx.cfg.seed * 7919 + ctx.id * 104729 + epoch);
      std::shuffle(order.begin(), order.end(), rng);
      order_epoch = epoch;
    }
    sample_batch b;
    b.n = batch;
    b.x.resize(batch * features);
    b.y.resize(batch);
    for (std::size_t i = 0; i < batch; ++i) {
      auto idx = order[(it * batch + i) % order.size()];
      std::copy_n(train.images.data() + idx * features, features, b.x.data() + i * features);
      b.y[i] = train.labels[idx];
    }
    return b;
  });
}

using compute_fn = decltype(training_plan::compute);

// Compute stage. Learning-rate schedule, applied on the worker by scaling its gradient
// (the servers' rule keeps --lr): linear decay to 10% over the run, which removes most of
// the last-iterate noise (MLP, 4 workers, BSP, 5 epochs: 0.866 constant). With --devices=N
// every device gets the pulled parameters and computes --batch samples on its own thread
// into its own buffers; the aggregator sums them into the push buffer.
compute_fn fmnist_compute(worker_context& ctx, std::shared_ptr<const fmnist::model> model, std::uint64_t iterations) {
  const auto devices = ctx.cfg.devices;
  const auto n = model->num_params();
  std::shared_ptr<gpu_aggregator> local;  // --devices > 1: gradients reduced here, one push
  if (devices > 1) local = std::make_shared<gpu_aggregator>(devices, n, parse_strategy(ctx.cfg.aggregation));
  auto computed = std::make_shared<std::uint64_t>(0);
  const auto share = ctx.cfg.batch;
  return [=](const std::vector<float>& p, const sample_batch& b, std::vector<float>& grad,
             const std::function<void(tensor_span)>& ready) {
    auto scale = static_cast<float>(1.0 - 0.9 * static_cast<double>((*computed)++) / iterations);
    auto scaled_ready = [&](fmnist::layer_span s) {
      for (std::size_t i = s.offset; i < s.offset + s.size; ++i) grad[i] *= scale;
      ready({s.offset, s.size});
    };
    if (!local) return model->loss_and_grad(p, b.x.data(), b.y.data(), b.n, grad, scaled_ready);
    local->broadcast(p.data());
    std::vector<float> losses(devices);
    std::vector<std::thread> running;
    const auto features = b.x.size() / b.n;
    for (std::size_t r = 0; r < devices; ++r)
      running.emplace_back([&, r] {
        losses[r] = model->loss_and_grad(local->params(r), b.x.data() + r * share * features, b.y.data() + r * share,
                                         share, local->gradient(r));
      });
    for (auto& t : running) t.join();
    grad.resize(n);
    local->reduce(grad.data());
    scaled_ready({0, n});
    return std::accumulate(losses.begin(), losses.end(), 0.0f) / static_cast<float>(devices);
  };
}

// The stragglers --slow-worker, --straggle and --faults' "slow worker=I factor=F" ask for.
straggler_model fmnist_stragglers(const worker_context& ctx) {
  auto slow = parse_slow_worker(ctx.cfg.slow_worker);
  auto straggle = parse_straggle(ctx.cfg.straggle);
  auto slow_factor = (slow.set && slow.worker == ctx.id ? slow.factor : 1.0) * ctx.cfg.fault_spec().slow_factor(ctx.id);
  return straggler_model(ctx.id, ctx.cfg.seed, slow_factor > 1 ? ctx.id : UINT32_MAX, slow_factor,
                         straggle.probability, straggle.factor);
}

// A worker's result line, with "data_plane_sent", "data_plane_received" and
// "data_plane_shm_sent" when it has a data plane: the bytes of its blocks that went beside
// CAF (and of those sent, the ones through shared memory); "data_plane_requests" and
// "data_plane_answers": the requests it sent and the answers it got over data connections
// instead of through CAF (--ps.direct-requests).
std::string with_data_plane(json_line line, worker_context& ctx) {
  if (const auto& plane = ctx.kv.options().plane) {
    line["data_plane_sent"] = plane->bytes_sent();
    line["data_plane_received"] = plane->bytes_received();
    line["data_plane_shm_sent"] = plane->shm_bytes_sent();
    line["data_plane_requests"] = plane->messages_sent();
    line["data_plane_answers"] = plane->messages_received();
    // Socket writes of plain frames, and the writes left to a connection's writer thread
    // (a wake-up each): a payload that did not fit its ring's room, a socket that was full.
    line["data_plane_socket_writes"] = plane->socket_writes();
    line["data_plane_writer_thread_writes"] = plane->writer_thread_writes();
    // Actors its reader threads ran themselves rather than waking a scheduler thread.
    line["data_plane_reader_runs"] = plane->reader_runs();
    line["data_plane_polled_reads"] = plane->polled_reads();
  }
  return line.dump();
}

std::string fmnist_app(worker_context& ctx) {
  auto data = fmnist::load_default(ctx.cfg.data);
  std::shared_ptr<const fmnist::model> model = fmnist::make_model(ctx.cfg.model);
  auto n = model->num_params();
  std::vector<float> params;
  model->init(params, ctx.cfg.seed);
  ctx.kv.init(key_set::single({0, n}), params).get();  // every worker offers the same values; the first wins
  const auto batch = ctx.cfg.batch * ctx.cfg.devices;  // each device computes --batch samples
  // From the job's starting size, so a worker that joins later runs to the same end.
  const auto iters_per_epoch = (data.train.count / std::max<std::uint32_t>(1, ctx.view.job_workers)) / batch;
  if (iters_per_epoch == 0)
    throw bad_request("--batch=" + std::to_string(batch) + " is larger than a worker's share of the data");
  auto loader = fmnist_loader(ctx, data.train, iters_per_epoch, batch);
  auto stragglers = fmnist_stragglers(ctx);
  std::vector<snapshot> snaps;
  auto start = clock_type::now();
  double next_snapshot = 0;
  training_plan plan;
  plan.num_params = n;
  plan.iterations = ctx.cfg.epochs * iters_per_epoch;
  plan.first_clock = std::min(ctx.start_clock, plan.iterations);  // a worker that joined a running job
  plan.pipelined = ctx.cfg.pipeline == "on";
  plan.compute = fmnist_compute(ctx, model, plan.iterations);
  progress_tracker progress(ctx.id, ctx.cfg.epochs, iters_per_epoch, 0.5);
  // Each worker scores its part of the test set at every epoch's end; the observer
  // weighs the parts into the epoch's accuracy.
  const auto workers = std::max<std::uint32_t>(1, ctx.view.job_workers);
  const auto test_first = data.test.count * ctx.id / workers;
  const auto test_count = data.test.count * (ctx.id + 1) / workers - test_first;
  std::uint64_t samples_done = 0;
  plan.after_iteration = [&](std::uint64_t clock, const std::vector<float>& p, float loss) {
    auto now = seconds_since(start);
    if (ctx.id == 0 && now >= next_snapshot) {
      snaps.push_back({now, p});
      next_snapshot = now + ctx.cfg.eval_every;
    }
    samples_done += batch;
    const auto epoch = clock / iters_per_epoch + 1;
    if (auto r = progress.step(epoch, clock + 1, samples_done, loss, now)) report_progress(ctx, *r);
    if ((clock + 1) % iters_per_epoch == 0)
      report_progress(ctx, progress.close_epoch(epoch, clock + 1, samples_done, "accuracy",
                                                fmnist::accuracy(*model, p, data.test, test_first, test_count),
                                                test_count));
  };
  auto stats = run_training(ctx.kv, loader, stragglers, plan);
  // Done: out of the clock vector (behind the last pushes), so nobody waits for this
  // worker's next clock; then everyone's last push is in.
  ctx.kv.leave_clock_vector().get();
  ctx.barrier();
  json_line out{{"worker", ctx.id},
                {"samples", stats.iterations * batch},
                {"train_seconds", stats.seconds},
                {"compute_seconds", stats.compute_seconds},
                {"wait_seconds", stats.wait_seconds},
                {"last_loss", stats.last_loss}};
  if (ctx.id == 0) {
    auto final_params = ctx.kv.pull(key_set::single({0, n})).get();
    snaps.push_back({stats.seconds, final_params});
    auto to_target = seconds_to_target(*model, snaps, data.test, ctx.cfg.target_accuracy);
    out["test_accuracy"] = fmnist::accuracy(*model, final_params, data.test);
    out["seconds_to_target"] = to_target < 0 ? nlohmann::json(nullptr) : nlohmann::json(to_target);
  }
  return with_data_plane(std::move(out), ctx);
}

// ---- kvcheck: exact sums under asynchronous pushes (ps-lite's test_kv_app) ----------

// What a worker's data plane carried so far, and the requests its client sent through CAF.
struct plane_counts {
  std::uint64_t caf_requests = 0, requests = 0, sent = 0, received = 0;
};

plane_counts data_plane_counts(worker_context& ctx) {
  plane_counts c;
  c.caf_requests = ctx.kv.requests_through_caf();
  if (const auto& plane = ctx.kv.options().plane) {
    c.requests = plane->messages_sent();
    c.sent = plane->bytes_sent();
    c.received = plane->bytes_received();
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

std::string kvcheck_app(worker_context& ctx) {
  constexpr int rounds = 10;
  auto shared = kvcheck_layout(0);
  auto own = [&](std::uint32_t w) { return kvcheck_layout((w + 1) * kvcheck_own_stride); };
  auto values_for = [](const tensor_layout& t, std::uint32_t w, int round) {
    std::vector<float> v;
    v.reserve(t.num_keys);
    for (const auto& r : t.ranges)
      for (key_type k = r.begin; k < r.end; ++k) v.push_back(kv_value(k, w, round));
    return v;
  };
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
  std::uint64_t checked = 0, mismatches = 0;
  std::string first;
  auto check = [&](const tensor_layout& t, std::vector<std::uint32_t> pushers) {
    auto got = ctx.kv.pull(key_set(t.ranges)).get();
    std::size_t i = 0;
    for (const auto& r : t.ranges)
      for (key_type k = r.begin; k < r.end; ++k, ++i) {
        double expect = 0;
        for (auto w : pushers)
          for (int round = 0; round < rounds; ++round) expect += kv_value(k, w, round);
        ++checked;
        if (got[i] != expect && mismatches++ == 0)
          first = "key " + std::to_string(k) + ": got " + std::to_string(got[i]) + ", expected " +
                  std::to_string(expect);
      }
  };
  std::vector<std::uint32_t> all;
  for (std::uint32_t w = 0; w < ctx.num_workers; ++w) all.push_back(w);
  check(shared, all);
  for (std::uint32_t w = 0; w < ctx.num_workers; ++w) check(own(w), {w});
  const auto after = data_plane_counts(ctx);
  ctx.barrier();  // nobody leaves while others still pull
  json_line out{{"worker", ctx.id}, {"checked", checked}, {"mismatches", mismatches},
                {"keys_per_push", shared.num_keys}, {"first_mismatch", first}};
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

// ---- clocksum: exact integer sums over clocks, the fault tests' app ------------------

constexpr key_type clocksum_keys = key_type{1} << 16;
constexpr std::uint32_t clocksum_table = 0;  // with --clock-rows: "clockrows"
constexpr std::uint32_t clocksum_row_dim = 4;

std::vector<sparse_table_spec> clocksum_tables(const node_config& cfg) {
  if (cfg.app_count("clock-rows") == 0) return {};
  return {{"clockrows", clocksum_row_dim, 0.0f, update_rule{}, cfg.seed}};
}

// Per shard (by `owner_of` each index), the one value all its entries hold (NaN if they differ).
template <class Owner>
json_line values_by_owner(const std::vector<float>& values, std::size_t per_entry, Owner owner_of) {
  std::map<std::uint32_t, double> per_shard;
  for (std::size_t i = 0; i < values.size(); ++i) {
    auto [it, fresh] = per_shard.emplace(owner_of(i / per_entry), values[i]);
    if (!fresh && it->second != values[i]) it->second = NAN;
  }
  json_line out = json_line::object();
  for (auto [id, v] : per_shard)
    out[std::to_string(id)] = std::isnan(v) ? json_line(nullptr) : json_line(static_cast<long long>(v));
  return out;
}

// One clock of clocksum: a pull (counted stale unless every value is `expected`), a push
// of the worker's w + 1, then the tick. With --clock-rows, the rows alike.
struct clocksum_step {
  worker_context& ctx;
  key_set keys;
  std::shared_ptr<std::vector<float>> mine;
  std::vector<std::uint64_t> row_ids;  // empty: no rows
  std::vector<float> row_grads;
  bool run(std::uint64_t c, double expected) {
    bool stale = false;
    auto rows = row_ids.empty() ? kv_future{} : ctx.kv.pull_rows(clocksum_table, row_ids);
    for (auto v : ctx.kv.pull(keys).get()) stale |= v != expected;
    if (!row_ids.empty())
      for (auto v : rows.get()) stale |= v != expected;
    auto pushed_rows = row_ids.empty() ? kv_future{} : ctx.kv.push_rows(clocksum_table, row_ids, row_grads);
    ctx.kv.push(keys, mine).get();
    if (!row_ids.empty()) pushed_rows.get();
    ctx.kv.advance_clock(c + 1).get();
    return stale;
  }
};

// --hold-at-clock: at that clock the worker says it holds (a line a test or an operator
// can wait for, then start a joiner or psctl), then waits, at most --ps.barrier-timeout-ms,
// until --hold-for-workers workers are live and the map holds exactly --hold-for-shards.
// So a job whose length gives a join or a leave its time can be held for it instead.
void hold_at_clock(worker_context& ctx, std::uint64_t c) {
  const auto workers = ctx.cfg.app_count("hold-for-workers");
  auto shards = ctx.cfg.app_counts("hold-for-shards");
  std::sort(shards.begin(), shards.end());
  const auto bound = std::chrono::milliseconds(ctx.cfg.barrier_timeout_ms);
  ctx.report("holding at clock " + std::to_string(c) + " until " + std::to_string(workers) + " workers are live" +
             (shards.empty() ? "" : " and the map holds shards " + json_line(shards).dump()));
  auto fail = [&](const std::string& what) {
    throw bad_request("clocksum held at clock " + std::to_string(c) + " for --ps.barrier-timeout-ms=" +
                      std::to_string(ctx.cfg.barrier_timeout_ms) + ", and " + what);
  };
  if (!ctx.kv.await_live_workers(workers, bound))
    fail("only " + std::to_string(ctx.kv.live_workers().size()) + " workers were live (--hold-for-workers=" +
         std::to_string(workers) + ")");
  auto exactly = [&](const partitioner& map) {
    return std::equal(map.shard_ids().begin(), map.shard_ids().end(), shards.begin(), shards.end(),
                      [](std::uint32_t id, std::int64_t want) { return id == want; });
  };
  if (!shards.empty() && !ctx.kv.await_map(exactly, bound))
    fail("the map holds shards " + json_line(ctx.kv.map().shard_ids()).dump() + ", not " + json_line(shards).dump() +
         " (--hold-for-shards)");
}

// Each clock every worker pulls the keys, pushes w + 1 to each and ticks. Under BSP the
// pull at clock c sees exactly c * sum(w + 1) everywhere; at the end every key of a shard
// holds (clocks minus clocks lost) * sum(w + 1), so a failover's effect is exact. With
// --clock-rows=N, rows 0..N-1 of a sparse table go the same way (row_values).
std::string clocksum_app(worker_context& ctx) {
  constexpr key_type num_keys = clocksum_keys;
  const auto clocks = ctx.cfg.app_count("clocks");
  double per_clock = 0;  // sum over workers of w + 1
  for (std::uint32_t w = 0; w < ctx.num_workers; ++w) per_clock += w + 1;
  clocksum_step step{ctx, key_set::single({0, num_keys}),
                     std::make_shared<std::vector<float>>(num_keys, static_cast<float>(ctx.id + 1)), {}, {}};
  for (std::uint64_t id = 0; id < ctx.cfg.app_count("clock-rows"); ++id) step.row_ids.push_back(id);
  step.row_grads.assign(step.row_ids.size() * clocksum_row_dim, static_cast<float>(ctx.id + 1));
  ctx.kv.init(step.keys, std::vector<float>(num_keys, 0.0f)).get();
  // From the first clock on, blocks and requests take the data connections (if any), not
  // however many came up while the job started. Best effort: connections still not up by
  // the request timeout leave their blocks to CAF, as before they come up.
  try {
    ctx.kv.await_data_connections(std::chrono::milliseconds(ctx.cfg.timeout_ms));
  } catch (const kv_error& e) {
    log_line(log_level::warning, "worker " + std::to_string(ctx.id) + ": " + e.what() + "; blocks go through CAF meanwhile");
  }
  std::uint64_t stale_reads = 0;  // clocks whose pulls did not see exactly c * per_clock
  auto start = clock_type::now();
  const auto loop_start = start;
  std::uint64_t pushes = 0;
  const auto hold_at = ctx.cfg.app_count("hold-at-clock");
  const bool holds = ctx.cfg.app_count("hold-for-workers") > 0 || !ctx.cfg.app_counts("hold-for-shards").empty();
  for (std::uint64_t c = ctx.start_clock; c < clocks; ++c) {
    if (holds && c == hold_at) hold_at_clock(ctx, c);
    if (auto ms = ctx.cfg.app_count("clock-ms"); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));  // "compute"
    stale_reads += step.run(c, c * per_clock);
    ++pushes;
    if (seconds_since(start) > 0.5) {
      ctx.report("clock " + std::to_string(c + 1) + "/" + std::to_string(clocks));
      start = clock_type::now();
    }
  }
  const auto train_seconds = seconds_since(loop_start);
  ctx.kv.leave_clock_vector().get();
  ctx.barrier();
  auto final_values = ctx.kv.pull(step.keys).get();
  auto final_rows = step.row_ids.empty() ? std::vector<float>{} : ctx.kv.pull_rows(clocksum_table, step.row_ids).get();
  ctx.barrier();  // nobody leaves while others still pull
  const auto& map = ctx.kv.map();
  auto result = json_line{{"worker", ctx.id},
                          {"clocks", clocks},
                          {"start_clock", ctx.start_clock},
                          {"pushes", pushes},
                          {"train_seconds", train_seconds},
                          {"per_clock", per_clock},
                          {"stale_reads", stale_reads},
                          {"shard_values", values_by_owner(final_values, 1, [&](std::size_t k) { return map.owner(k); })},
                          {"recovery_ms", ctx.kv.recovery_times_ms()}};
  if (!step.row_ids.empty())
    result["row_values"] = values_by_owner(final_rows, clocksum_row_dim,
                                           [&](std::size_t i) { return map.row_owner(clocksum_table, step.row_ids[i]); });
  return with_data_plane(std::move(result), ctx);
}

// ---- bench: push/pull throughput and latency per (size, window) ---------------------

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
  auto issue = [&] {
    kv_future f;
    if (op == "push") {
      f = ctx.kv.push(t.keys, t.payload);
    } else {
      auto& from = t.spare;
      f = ctx.kv.pull(t.keys, std::move(t.rotate ? from.front() : from.back()));
      t.rotate ? from.pop_front() : from.pop_back();
    }
    inflight.emplace_back(std::move(f), clock_type::now());
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

}  // namespace

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(bench_cell, op, bytes, window, worker, ops, seconds, latencies_us, round,
                                   tcp_limit_gbps, memcpy_gbps)

std::string bench_cell::encode() const { return encode_cell(*this); }
bench_cell bench_cell::decode(const std::string& text) { return decode_cell<bench_cell>(text, "a bench cell report"); }

nlohmann::json shard_figures(const kv_client& kv) {
  auto all = nlohmann::json::array();
  for (const auto& text : kv.shard_stats()) all.push_back(nlohmann::json::parse(text));
  return all;
}

double shard_totals::ram_hit_rate() const {
  auto lookups = ram_hits + ram_misses;
  return lookups ? static_cast<double>(ram_hits) / static_cast<double>(lookups) : 1.0;
}

shard_totals total_of(const nlohmann::json& shards) {
  shard_totals t;
  std::map<std::uint64_t, std::uint64_t> read_by_pid;
  auto count = [](const nlohmann::json& s, const char* field) { return s.value(field, std::uint64_t{0}); };
  for (const auto& s : shards) {
    t.rows += count(s, "rows");
    t.rows_expired += count(s, "rows_expired");
    t.row_pushes_refused += count(s, "row_pushes_refused");
    t.table_bytes += count(s, "table_bytes");
    t.ram_bytes += count(s, "ram_bytes");
    t.ram_budget += count(s, "ram_budget");
    t.ram_hits += count(s, "ram_hits");
    t.ram_misses += count(s, "ram_misses");
    t.peak_rss = std::max(t.peak_rss, count(s, "peak_rss"));
    read_by_pid[count(s, "pid")] = count(s, "disk_bytes_read");
  }
  for (const auto& [pid, bytes] : read_by_pid) t.disk_bytes_read += bytes;
  return t;
}

std::vector<nlohmann::json> json_lines_of(const std::string& out) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) lines.push_back(std::move(j));
  }
  return lines;
}

std::optional<std::string> output_of(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    std::fprintf(stderr, "cannot run %s: %s\n", cmd.c_str(), std::strerror(errno));
    return std::nullopt;
  }
  std::string out;
  char buf[4096];
  while (auto n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  int status = pclose(p);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "failed (status %d): %s\n%s\n", status, cmd.c_str(), out.c_str());
    return std::nullopt;
  }
  return out;
}

namespace {

// The dense tensors an app's workers push and pull, for the job spec.
std::vector<tensor_spec> contiguous_tensors(const std::string& prefix, const tensor_layout& t) {
  std::vector<tensor_spec> out;
  for (const auto& r : t.ranges)
    if (r.size() > 1) out.push_back({prefix + "@" + std::to_string(r.begin), r, {r.size()}});
  return out;
}

std::vector<tensor_spec> fmnist_tensors(const node_config& cfg) {
  auto n = fmnist::make_model(cfg.model)->num_params();
  return {{cfg.model, {0, n}, {n}}};
}

std::vector<tensor_spec> kvcheck_tensors(const node_config& cfg) {
  auto out = contiguous_tensors("shared", kvcheck_layout(0));
  for (std::uint32_t w = 0; w < cfg.workers; ++w) {
    auto own = contiguous_tensors("worker" + std::to_string(w), kvcheck_layout((w + 1) * kvcheck_own_stride));
    out.insert(out.end(), own.begin(), own.end());
  }
  return out;
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

std::vector<app_flag> clocksum_flags() {
  return {{"clocks", app_flag_kind::count, "40", "clocksum: iterations (clock ticks) per worker",
           [](const node_config& c) { return c.app_count("clocks") >= 1 ? "" : "must be >= 1"; }},
          {"clock-ms", app_flag_kind::count, "0", "clocksum: simulated compute per clock, in ms", {}},
          {"clock-rows", app_flag_kind::count, "0",
           "clocksum: rows 0..N-1 of a sparse table (dim 4) pulled, pushed and checked each clock too", {}},
          // A job held for a joiner or a map change at a known clock (hold_at_clock).
          {"hold-at-clock", app_flag_kind::count, "0",
           "clocksum: with --hold-for-workers or --hold-for-shards, the clock the workers wait at",
           [](const node_config& c) {
             const bool holds = c.app_count("hold-for-workers") > 0 || !c.app_counts("hold-for-shards").empty();
             return !holds || c.app_count("hold-at-clock") < c.app_count("clocks") ? "" : "must be below --clocks";
           }},
          {"hold-for-workers", app_flag_kind::count, "0",
           "clocksum: at --hold-at-clock, wait (at most --ps.barrier-timeout-ms) until this many workers are live", {}},
          {"hold-for-shards", app_flag_kind::counts, "[]",
           "clocksum: at --hold-at-clock, wait (at most --ps.barrier-timeout-ms) until the map holds exactly these "
           "shards, e.g. [1,2] after a join and a leave",
           [](const node_config& c) -> std::string {
             std::set<std::int64_t> seen;
             for (auto id : c.app_counts("hold-for-shards")) {
               if (id < 0 || id > UINT32_MAX) return std::to_string(id) + " is not a shard id";
               if (!seen.insert(id).second) return "shard " + std::to_string(id) + " is named twice";
             }
             return "";
           }}};
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

void register_builtin_apps() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_app({"fmnist", "Fashion-MNIST softmax or MLP, data-parallel", fmnist_app, "sgd", "bsp", fmnist_tensors, {},
                  {}, true});
    register_app({"kvcheck", "exact sums under asynchronous pushes", kvcheck_app, "sum", "asp", kvcheck_tensors, {}});
    register_app({"clocksum", "exact integer sums per clock, the fault tests' app", clocksum_app, "sum", "bsp",
                  [](const node_config&) {
                    return std::vector<tensor_spec>{{"clocksum", {0, clocksum_keys}, {clocksum_keys}}};
                  },
                  clocksum_flags(), clocksum_tables, true});
    register_app({"bench", "push/pull throughput per size and window (bench_kv)", bench_app, "sum", "asp",
                  bench_tensors, bench_flags()});
    register_app(rowcheck_definition());
    register_app(elastic_load_definition());
    register_app(sparse_bench_definition());
    register_app(ctr_definition());
  });
}

}  // namespace ps
