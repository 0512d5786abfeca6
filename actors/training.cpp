#include "actors/training.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
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

batch_loader::batch_loader(caf::actor_system& sys, make_fn make, bool own_thread) : sys_(&sys) {
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
  caf::scoped_actor self{loader.system()};  // asks the app's stages
  training_stats st{};
  key_set all = key_set::single({plan.base, plan.base + plan.num_params});
  clock_type::time_point start = clock_type::now();

  key_set keys_of(tensor_span s) const { return key_set::single({plan.base + s.offset, plan.base + s.offset + s.size}); }

  // Computes one iteration; `push` gets each finished span. Stretches compute when this
  // worker straggles in this iteration (the simulated slow device).
  void compute(std::uint64_t c, const std::vector<float>& params, const sample_batch& batch, std::span<float> grad,
               const std::function<void(tensor_span)>& push) {
    auto factor = stragglers.factor_for_next_iteration();
    auto t0 = clock_type::now();
    st.last_loss = plan.compute(params, batch, grad, push);
    auto took = clock_type::now() - t0;
    if (factor > 1) std::this_thread::sleep_for(std::chrono::duration_cast<clock_type::duration>(took * (factor - 1)));
    st.compute_seconds += seconds_between(t0, clock_type::now());
    if (plan.after_iteration) plan.after_iteration(c, params, st.last_loss);
  }

  // Asks stage `index` of `kind` about iteration c and waits for its answer; throws
  // kv_error naming the stage when it fails, is gone or does not answer in time.
  template <class Stage, class Value>
  Value through(const Stage& stage, const char* kind, std::size_t index, std::uint64_t c, Value value) {
    std::optional<Value> out;
    std::string failure;
    self->request(stage, plan.stage_timeout, stage_atom::value, c, std::move(value))
      .receive([&](Value& v) { out = std::move(v); }, [&](caf::error& e) { failure = describe(e); });
    if (!out)
      throw kv_error("training: " + std::string(kind) + " stage " + std::to_string(index) + " failed at clock " +
                     std::to_string(c) + ": " + failure);
    return std::move(*out);
  }

  sample_batch staged(std::uint64_t c, sample_batch batch) {
    for (std::size_t i = 0; i < plan.batch_stages.size(); ++i) batch = through(plan.batch_stages[i], "batch", i, c, std::move(batch));
    return batch;
  }

  void staged(std::uint64_t c, const std::shared_ptr<std::vector<float>>& grad, tensor_span s) {
    for (std::size_t i = 0; i < plan.gradient_stages.size(); ++i) {
      auto back = through(plan.gradient_stages[i], "gradient", i, c, gradient_span{grad, s});
      if (back.buffer != grad || back.span.offset != s.offset || back.span.size != s.size)
        throw kv_error("training: gradient stage " + std::to_string(i) + " answered with another span than the one " +
                       "it was given");
    }
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
      auto batch = staged(c, loader.request(c).get());
      auto pulled = kv.pull(all);
      auto params = wait_params(pulled);
      auto grad = std::make_shared<std::vector<float>>(plan.num_params);
      compute(c, params, batch, *grad, [](tensor_span) {});
      staged(c, grad, {0, plan.num_params});
      kv.push_and_advance(all, grad, 0, c + 1).get();
      ++st.iterations;
    }
    return done();
  }

  // A span reported twice or past the parameters is refused before anything of it is
  // sent. `reported` holds the spans so far, sorted by offset: backward reports a few
  // (one per layer), so a sorted vector beats a flag per parameter.
  void check_span(const tensor_span& s, std::vector<tensor_span>& reported) const {
    auto refuse = [&](const std::string& why) {
      throw kv_error("training: ready(offset " + std::to_string(s.offset) + ", size " + std::to_string(s.size) + "): " +
                     why);
    };
    if (s.offset > plan.num_params || plan.num_params - s.offset < s.size)
      refuse("runs past the " + std::to_string(plan.num_params) + " parameters");
    auto after = std::upper_bound(reported.begin(), reported.end(), s.offset,
                                  [](std::size_t offset, const tensor_span& r) { return offset < r.offset; });
    bool overlaps_before = after != reported.begin() && std::prev(after)->offset + std::prev(after)->size > s.offset;
    bool overlaps_after = after != reported.end() && s.offset + s.size > after->offset;
    if (overlaps_before || overlaps_after) refuse("some of these values were reported ready already");
    reported.insert(after, s);
  }

  // Iteration c's spans, pushed as backward finishes each (sharing grad, no copy); the span
  // that completes the gradient carries the iteration's clock tick.
  std::deque<kv_future> compute_and_push(std::uint64_t c, const std::vector<float>& params, const sample_batch& batch) {
    std::deque<kv_future> pushes;
    auto grad = std::make_shared<std::vector<float>>(plan.num_params);
    std::vector<tensor_span> reported;
    std::size_t pushed = 0;
    compute(c, params, batch, *grad, [&](tensor_span s) {
      check_span(s, reported);
      staged(c, grad, s);
      bool last = pushed + s.size == plan.num_params;
      pushes.push_back(last ? kv.push_and_advance(keys_of(s), grad, s.offset, c + 1) : kv.push(keys_of(s), grad, s.offset));
      pushed += s.size;
    });
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
      auto batch = staged(c, next_batch.get());
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
