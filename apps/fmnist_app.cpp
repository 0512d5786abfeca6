// The fmnist app: Fashion-MNIST softmax or MLP, data-parallel, through the training stages.
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
  return [=](const std::vector<float>& p, const sample_batch& b, std::span<float> grad,
             const std::function<void(tensor_span)>& ready) {
    auto scale = static_cast<float>(1.0 - 0.9 * static_cast<double>((*computed)++) / iterations);
    auto scaled_ready = [&](fmnist::layer_span s) {
      for (std::size_t i = s.offset; i < s.offset + s.size; ++i) grad[i] *= scale;
      ready({s.offset, s.size});
    };
    std::vector<std::uint8_t> classes(b.y.begin(), b.y.end());  // the models take class ids
    // p is the pull of the plan's num_params, the model's size (fmnist_plan)
    if (!local) return model->loss_and_grad(p.data(), b.x.data(), classes.data(), b.n, grad.data(), scaled_ready);
    local->broadcast(p.data());
    std::vector<float> losses(devices);
    std::vector<std::thread> running;
    const auto features = b.x.size() / b.n;
    for (std::size_t r = 0; r < devices; ++r)
      running.emplace_back([&, r] {
        losses[r] = model->loss_and_grad(local->params(r), b.x.data() + r * share * features, classes.data() + r * share,
                                         share, local->gradient(r));
      });
    for (auto& t : running) t.join();
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

// The worker's result line once it trained: worker 0 also scores the final parameters
// and finds when the snapshots first reached --target-accuracy.
std::string fmnist_result(worker_context& ctx, const fmnist::model& model, const fmnist::dataset& test,
                          const training_stats& stats, std::uint64_t batch, std::vector<snapshot>& snaps) {
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
    auto final_params = ctx.kv.pull(key_set::single({0, model.num_params()})).get();
    snaps.push_back({stats.seconds, final_params});
    auto to_target = seconds_to_target(model, snaps, test, ctx.cfg.target_accuracy);
    out["test_accuracy"] = fmnist::accuracy(model, final_params, test);
    out["seconds_to_target"] = to_target < 0 ? nlohmann::json(nullptr) : nlohmann::json(to_target);
  }
  return with_data_plane(std::move(out), ctx);
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
  return fmnist_result(ctx, *model, data.test, stats, batch, snaps);
}

std::vector<tensor_spec> fmnist_tensors(const node_config& cfg) {
  auto n = fmnist::make_model(cfg.model)->num_params();
  return {{cfg.model, {0, n}, {n}}};
}

}  // namespace

app_definition fmnist_definition() {
  return {"fmnist", "Fashion-MNIST softmax or MLP, data-parallel", fmnist_app, "sgd", "bsp", fmnist_tensors, {}, {}, true};
}

}  // namespace ps
