#include "actors/training.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <thread>

namespace ps {
namespace detail {
using batch_promise = std::shared_ptr<std::promise<sample_batch>>;
}  // namespace detail
}  // namespace ps

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ps::detail::batch_promise)

namespace ps {

using clock_type = std::chrono::steady_clock;

namespace {

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

batch_loader::batch_loader(caf::actor_system& sys, make_fn make, bool own_thread) {
  auto loader = [make = std::move(make)](caf::event_based_actor*) -> caf::behavior {
    return {[=](std::uint64_t clock, detail::batch_promise& p) {
      try {
        p->set_value(make(clock));
      } catch (...) {
        p->set_exception(std::current_exception());
      }
    }};
  };
  // Detached: loading runs beside compute.
  actor_ = own_thread ? sys.spawn<caf::detached>(loader) : sys.spawn(loader);
}

batch_loader::~batch_loader() { caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown); }

std::future<sample_batch> batch_loader::request(std::uint64_t clock) {
  auto p = std::make_shared<std::promise<sample_batch>>();
  auto f = p->get_future();
  caf::anon_send(actor_, clock, std::move(p));
  return f;
}

straggler_model::straggler_model(std::uint32_t worker, std::uint64_t seed, std::uint32_t slow_worker,
                                 double slow_factor, double straggle_p, double straggle_factor)
    : persistent_(worker == slow_worker ? slow_factor : 1.0),
      p_(straggle_p),
      transient_(straggle_factor),
      rng_(seed * 1000003 + worker) {}

double straggler_model::factor_for_next_iteration() {
  double f = persistent_;
  if (p_ > 0) {
    // Uniform in [0,1) from raw 53 bits: the same on every platform for a seed.
    double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    if (u < p_) f *= transient_;
  }
  return f;
}

namespace {

// One run_training: the plan, its counters, and the steps both schedules share.
struct training_run {
  kv_client& kv;
  batch_loader& loader;
  straggler_model& stragglers;
  const training_plan& plan;
  training_stats st{};
  key_set all = key_set::single({plan.base, plan.base + plan.num_params});
  clock_type::time_point start = clock_type::now();

  key_set keys_of(tensor_span s) const { return key_set::single({plan.base + s.offset, plan.base + s.offset + s.size}); }

  // Computes one iteration; `push` gets each finished span. Stretches compute when this
  // worker straggles in this iteration (the simulated slow device).
  void compute(std::uint64_t c, const std::vector<float>& params, const sample_batch& batch, std::vector<float>& grad,
               const std::function<void(tensor_span)>& push) {
    auto factor = stragglers.factor_for_next_iteration();
    auto t0 = clock_type::now();
    st.last_loss = plan.compute(params, batch, grad, push);
    auto took = clock_type::now() - t0;
    if (factor > 1) std::this_thread::sleep_for(std::chrono::duration_cast<clock_type::duration>(took * (factor - 1)));
    st.compute_seconds += seconds_between(t0, clock_type::now());
    if (plan.after_iteration) plan.after_iteration(c, params, st.last_loss);
  }

  std::vector<float> wait_params(kv_future& f) {
    auto t0 = clock_type::now();
    auto params = f.get();
    st.wait_seconds += seconds_between(t0, clock_type::now());
    return params;
  }

  training_stats done() {
    st.seconds = seconds_between(start, clock_type::now());
    return st;
  }

  // --pipeline=off: each stage waits for the one before.
  training_stats sequential() {
    for (std::uint64_t c = plan.first_clock; c < plan.iterations; ++c) {
      auto batch = loader.request(c).get();
      auto pulled = kv.pull(all);
      auto params = wait_params(pulled);
      std::vector<float> grad(plan.num_params);
      compute(c, params, batch, grad, [](tensor_span) {});
      if (grad.size() != plan.num_params)
        throw kv_error("training: compute left " + std::to_string(grad.size()) + " gradient values, not " +
                       std::to_string(plan.num_params));
      kv.push_and_advance(all, std::make_shared<std::vector<float>>(std::move(grad)), 0, c + 1).get();
      ++st.iterations;
    }
    return done();
  }

  void check_span(const tensor_span& s, const std::vector<float>& grad, const float* where,
                  std::vector<bool>& reported) const {
    auto what = "training: ready(offset " + std::to_string(s.offset) + ", size " + std::to_string(s.size) + "): ";
    if (s.offset > plan.num_params || plan.num_params - s.offset < s.size)
      throw kv_error(what + "runs past the " + std::to_string(plan.num_params) + " parameters");
    if (grad.data() != where || grad.size() != plan.num_params)
      throw kv_error(what + "the gradient buffer was resized or moved after it was handed out sized to " +
                     std::to_string(plan.num_params) + " (pushes in flight read it)");
    auto first = reported.begin() + static_cast<std::ptrdiff_t>(s.offset);
    if (std::find(first, first + static_cast<std::ptrdiff_t>(s.size), true) != first + static_cast<std::ptrdiff_t>(s.size))
      throw kv_error(what + "some of these values were reported ready already");
    std::fill(first, first + static_cast<std::ptrdiff_t>(s.size), true);
  }

  // Iteration c's spans, pushed as backward finishes each (sharing grad, no copy); the span
  // that completes the gradient carries the iteration's clock tick.
  // A span is refused before anything is sent when it was reported already, runs past the
  // parameters, or lies in a buffer that moved since the first span left (pushes in flight
  // read it): the buffer comes sized to num_params and must stay where it is.
  std::deque<kv_future> compute_and_push(std::uint64_t c, const std::vector<float>& params, const sample_batch& batch) {
    std::deque<kv_future> pushes;
    auto grad = std::make_shared<std::vector<float>>(plan.num_params);
    const float* where = grad->data();
    std::vector<bool> reported(plan.num_params, false);
    std::size_t pushed = 0;
    compute(c, params, batch, *grad, [&](tensor_span s) {
      check_span(s, *grad, where, reported);
      bool last = pushed + s.size == plan.num_params;
      pushes.push_back(last ? kv.push_and_advance(keys_of(s), grad, s.offset, c + 1) : kv.push(keys_of(s), grad, s.offset));
      pushed += s.size;
    });
    if (grad->data() != where || grad->size() != plan.num_params)  // spans in flight may have read freed memory
      throw kv_error("training: the gradient buffer was resized or moved during compute, after it was handed out "
                     "sized to " + std::to_string(plan.num_params));
    if (pushed != plan.num_params)
      throw kv_error("training: compute reported " + std::to_string(pushed) + " of " + std::to_string(plan.num_params) +
                     " gradient values ready");
    return pushes;
  }

  // The pipeline: the next batch loads and the next pull leaves while this iteration computes.
  training_stats pipelined() {
    if (plan.first_clock >= plan.iterations) return done();
    std::deque<kv_future> previous;  // pushes and ticks of the iteration before
    auto next_batch = loader.request(plan.first_clock);
    auto pulled = kv.pull(all);
    for (std::uint64_t c = plan.first_clock; c < plan.iterations; ++c) {
      auto params = wait_params(pulled);
      auto batch = next_batch.get();
      if (c + 1 < plan.iterations) next_batch = loader.request(c + 1);
      auto current = compute_and_push(c, params, batch);
      if (c + 1 < plan.iterations) pulled = kv.pull(all);  // prefetch, gated by the shards
      // At most two iterations of pushes in flight; their errors surface here.
      for (auto& f : previous) f.get();
      previous = std::move(current);
      ++st.iterations;
    }
    for (auto& f : previous) f.get();
    return done();
  }
};

}  // namespace

training_stats run_training(kv_client& kv, batch_loader& loader, straggler_model& stragglers,
                            const training_plan& plan) {
  training_run run{kv, loader, stragglers, plan};
  return plan.pipelined ? run.pipelined() : run.sequential();
}

training_stats run_training(kv_client& kv, batch_loader& loader, const training_plan& plan) {
  straggler_model none(0, 0, UINT32_MAX, 1, 0, 1);  // nobody is slow
  return run_training(kv, loader, none, plan);
}

}  // namespace ps
