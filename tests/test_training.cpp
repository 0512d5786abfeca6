// The training stages' guard on the gradient buffer: a span reported ready twice, one past
// the parameters, or one of a buffer the app resized after it was handed out is refused
// before it is pushed, and the job fails naming it; a compute that keeps to the rules trains.
#include <doctest/doctest.h>

#include <actorps/actorps.hpp>

#include <stdexcept>

#include "actors/training.hpp"

namespace {

constexpr std::size_t num_params = 8;

using compute_fn = decltype(ps::training_plan::compute);

// An embedded job of 1 server and 1 worker whose worker trains 2 iterations with `compute`.
ps::job_result train_with(const std::string& name, compute_fn compute) {
  auto app = [compute](ps::worker_context& ctx) {
    ps::batch_loader loader(ctx.sys, [](std::uint64_t) { return ps::sample_batch{{1.0f}, {2.5f}, 1}; });
    ps::straggler_model none(ctx.id, 1, UINT32_MAX, 1, 0, 1);
    ps::training_plan plan;
    plan.num_params = num_params;
    plan.iterations = 2;
    plan.compute = compute;
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
  auto res = train_with("train_right", [](const std::vector<float>&, const ps::sample_batch& b, std::vector<float>& grad,
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
  auto res = train_with("train_twice", [](const std::vector<float>&, const ps::sample_batch&, std::vector<float>& grad,
                                          const std::function<void(ps::tensor_span)>& ready) {
    std::fill(grad.begin(), grad.end(), 1.0f);
    ready({0, 4});
    ready({2, 6});
    return 0.5f;
  });
  CHECK_FALSE(res.ok);
  CHECK(failures_of(res).find("ready(offset 2, size 6): some of these values were reported ready already") !=
        std::string::npos);
}

TEST_CASE("training: a span past the parameters, or of a buffer resized after it was handed out, is refused") {
  auto past = train_with("train_past", [](const std::vector<float>&, const ps::sample_batch&, std::vector<float>&,
                                          const std::function<void(ps::tensor_span)>& ready) {
    ready({6, 4});
    return 0.5f;
  });
  CHECK(failures_of(past).find("runs past the 8 parameters") != std::string::npos);
  auto moved = train_with("train_moved", [](const std::vector<float>&, const ps::sample_batch&, std::vector<float>& grad,
                                            const std::function<void(ps::tensor_span)>& ready) {
    grad = std::vector<float>(num_params, 1.0f);  // a new buffer: pushes in flight would read the old one
    ready({0, num_params});
    return 0.5f;
  });
  CHECK(failures_of(moved).find("the gradient buffer was resized or moved") != std::string::npos);
}
