// The training stages' guard on the gradient buffer: a span reported ready twice, one past
// the parameters, or one of a buffer the app resized after it was handed out is refused
// before it is pushed, and the job fails naming it; a compute that keeps to the rules trains.
#include <doctest/doctest.h>

#include <actorps/actorps.hpp>

#include <span>
#include <stdexcept>
#include <type_traits>

#include "actors/training.hpp"

namespace {

constexpr std::size_t num_params = 8;

using compute_fn = decltype(ps::training_plan::compute);

// An embedded job of 1 server and 1 worker whose worker trains 2 iterations with `compute`.
using stages_fn = std::function<void(caf::actor_system&, ps::training_plan&)>;
ps::job_result train_with(const std::string& name, compute_fn compute, stages_fn stages = {}) {
  auto app = [compute, stages](ps::worker_context& ctx) {
    ps::batch_loader loader(ctx.sys, [](std::uint64_t) { return ps::sample_batch{{1.0f}, {2.5f}, 1}; });
    ps::straggler_model none(ctx.id, 1, UINT32_MAX, 1, 0, 1);
    ps::training_plan plan;
    plan.num_params = num_params;
    plan.iterations = 2;
    plan.compute = compute;
    if (stages) stages(ctx.sys, plan);
    if (ctx.id == 0) ctx.kv.init(ps::key_set::single({0, num_params}), std::vector<float>(num_params, 0.0f)).get();
    ctx.barrier();
    auto stats = ps::run_training(ctx.kv, loader, none, plan);
    return nlohmann::json{{"iterations", stats.iterations}}.dump();
  };
  ps::register_app({name, "trains with a given compute", app, "sum", "bsp",
                    [](const ps::node_config&) {
                      return std::vector<ps::tensor_spec>{{"w", {0, num_params}, {num_params}}};
                    },
                    {}});
  ps::node_config cfg;
  cfg.cluster = "embedded";
  cfg.servers = 1;
  cfg.workers = 1;
  caf::actor_system sys{cfg};
  return ps::run_job(sys, cfg, ps::find_app(name), name, ps::settings_for_app(cfg, name));
}

std::string failures_of(const ps::job_result& res) {
  std::string all;
  for (const auto& f : res.failures) all += f + "\n";
  return all + res.reason;
}

}  // namespace

TEST_CASE("training: a compute that reports each span once into the buffer it was given trains, on float labels") {
  auto res = train_with("train_right", [](const std::vector<float>&, const ps::sample_batch& b, std::span<float> grad,
                                          const std::function<void(ps::tensor_span)>& ready) {
    if (b.y.at(0) != 2.5f) throw std::runtime_error("the regression target did not arrive as 2.5");
    std::fill(grad.begin(), grad.end(), 1.0f);
    ready({4, 4});
    ready({0, 4});
    return 0.5f;
  });
  CHECK_MESSAGE(res.ok, failures_of(res));
}

TEST_CASE("training: a span reported ready twice is refused before it is pushed") {
  auto res = train_with("train_twice", [](const std::vector<float>&, const ps::sample_batch&, std::span<float> grad,
                                          const std::function<void(ps::tensor_span)>& ready) {
    std::fill(grad.begin(), grad.end(), 1.0f);
    ready({0, 4});
    ready({2, 6});
    return 0.5f;
  });
  CHECK_FALSE(res.ok);
  CHECK(failures_of(res).find("ready(offset 2, size 6): some of these values were reported ready already") !=
        std::string::npos);
  auto before = train_with("train_twice_before", [](const std::vector<float>&, const ps::sample_batch&, std::span<float>,
                                                    const std::function<void(ps::tensor_span)>& ready) {
    ready({4, 4});
    ready({1, 4});  // ends inside the span reported first
    return 0.5f;
  });
  CHECK(failures_of(before).find("ready(offset 1, size 4): some of these values were reported ready already") !=
        std::string::npos);
}

// The gradient buffer is the library's: compute gets a view of it, which cannot resize
// it or point it at other memory (pushes in flight read it).
template <class F>
struct grad_parameter;
template <class R, class P, class B, class G, class Ready>
struct grad_parameter<std::function<R(P, B, G, Ready)>> {
  using type = G;
};
static_assert(std::is_same_v<grad_parameter<decltype(ps::training_plan::compute)>::type, std::span<float>>);

TEST_CASE("training: a span past the parameters is refused") {
  auto past = train_with("train_past", [](const std::vector<float>&, const ps::sample_batch&, std::span<float>,
                                          const std::function<void(ps::tensor_span)>& ready) {
    ready({6, 4});
    return 0.5f;
  });
  CHECK(failures_of(past).find("runs past the 8 parameters") != std::string::npos);
}

namespace {

float fill_ones(const std::vector<float>&, const ps::sample_batch&, std::span<float> grad,
                const std::function<void(ps::tensor_span)>& ready) {
  std::fill(grad.begin(), grad.end(), 1.0f);
  ready({0, 4});
  ready({4, 4});
  return 0.5f;
}

}  // namespace

TEST_CASE("training: the app's stages see every batch and every span, in order, and may change them") {
  auto log = std::make_shared<std::vector<std::string>>();  // the stages' actors and the compute run by turns
  auto res = train_with(
    "train_staged",
    [log](const std::vector<float>&, const ps::sample_batch& b, std::span<float> grad,
          const std::function<void(ps::tensor_span)>& ready) {
      log->push_back("compute y=" + std::to_string(static_cast<int>(b.y.at(0))));
      return fill_ones({}, b, grad, ready);
    },
    [log](caf::actor_system& sys, ps::training_plan& plan) {
      plan.batch_stages.push_back(sys.spawn([log]() -> ps::batch_stage::behavior_type {
        return {[log](ps::stage_atom, std::uint64_t c, ps::sample_batch& b) {
          log->push_back("batch " + std::to_string(c));
          b.y[0] = 7.0f;  // what compute gets
          return std::move(b);
        }};
      }));
      plan.gradient_stages.push_back(sys.spawn([log]() -> ps::gradient_stage::behavior_type {
        return {[log](ps::stage_atom, std::uint64_t c, ps::gradient_span& g) {
          log->push_back("span " + std::to_string(c) + ":" + std::to_string(g.span.offset) + " " +
                         std::to_string(g.values()[0]));
          return g;
        }};
      }));
    });
  CHECK_MESSAGE(res.ok, failures_of(res));
  // Pipelined: the batch of clock 1 passes its stage after clock 0's spans were pushed.
  CHECK(*log == std::vector<std::string>{"batch 0", "compute y=7", "span 0:0 1.000000", "span 0:4 1.000000", "batch 1",
                                         "compute y=7", "span 1:0 1.000000", "span 1:4 1.000000"});
}

TEST_CASE("training: a stage that is gone fails the worker, naming the stage and the clock") {
  auto res = train_with("train_stage_gone", fill_ones, [](caf::actor_system& sys, ps::training_plan& plan) {
    auto gone = sys.spawn([]() -> ps::gradient_stage::behavior_type {
      return {[](ps::stage_atom, std::uint64_t, ps::gradient_span& g) { return g; }};
    });
    caf::scoped_actor self{sys};
    self->monitor(gone);
    caf::anon_send_exit(gone, caf::exit_reason::user_shutdown);
    self->receive([](caf::down_msg&) {});  // gone before the job asks it
    plan.gradient_stages.push_back(gone);
  });
  CHECK_FALSE(res.ok);
  CHECK(failures_of(res).find("training: gradient stage 0 failed at clock 0") != std::string::npos);
}
