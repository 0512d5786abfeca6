// custom_stage: stages of the app's own in the training pipeline. Linear regression on
// synthetic rows, SGD on the servers, pipelined SSP; two typed actors the app writes:
//   batch_counter (a batch stage): sees every batch between the loader and compute, and
//     counts the batches and rows and each clock it saw
//   clipper (a gradient stage): sees every gradient span before its push and clips its
//     values to [-1, 1]
// Each worker checks that its batch stage saw every one of its iterations exactly once
// and that the weights came within 0.05 of the true ones. Exits 0 only then.
// As processes by default; --cluster=embedded in one.
#include <actorps/actorps.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr std::size_t dim = 8, rows = 32;
constexpr std::uint64_t iterations = 300;

float true_weight(std::size_t j) { return static_cast<float>(j) / 4.0f - 1.0f; }

ps::sample_batch draw(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> gauss;
  ps::sample_batch b{std::vector<float>(rows * dim), std::vector<float>(rows), rows};
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < dim; ++j) b.x[r * dim + j] = gauss(rng);
    for (std::size_t j = 0; j < dim; ++j) b.y[r] += true_weight(j) * b.x[r * dim + j];
    b.y[r] += 0.01f * gauss(rng);
  }
  return b;
}

// The batch stage: a typed actor of the app's own, with a question of its own besides.
using seen_atom = caf::atom_constant<caf::atom("seen")>;
using batch_counter = ps::batch_stage::extend<caf::replies_to<seen_atom>::with<std::uint64_t, std::uint64_t>>;
struct counts {
  std::uint64_t batches = 0, rows = 0;
  std::vector<std::uint64_t> per_clock = std::vector<std::uint64_t>(iterations);
};
batch_counter::behavior_type count_batches(batch_counter::stateful_pointer<counts> self) {
  return {[=](ps::stage_atom, std::uint64_t clock, ps::sample_batch& b) {
            auto& s = self->state;
            ++s.batches;
            s.rows += b.n;
            if (clock < iterations) ++s.per_clock[clock];
            return std::move(b);
          },
          [=](seen_atom) {
            std::uint64_t once = 0;
            for (auto n : self->state.per_clock) once += n == 1;
            return caf::make_result(self->state.batches, once);
          }};
}

// The gradient stage: clips in place what compute produced.
ps::gradient_stage::behavior_type clip_gradients() {
  return {[](ps::stage_atom, std::uint64_t, ps::gradient_span& g) {
    for (auto& v : g.values()) v = std::clamp(v, -1.0f, 1.0f);
    return g;
  }};
}

float squared_loss(const std::vector<float>& w, const ps::sample_batch& b, std::span<float> grad,
                   const std::function<void(ps::tensor_span)>& ready) {
  float loss = 0;
  for (std::size_t r = 0; r < b.n; ++r) {
    float err = -b.y[r];
    for (std::size_t j = 0; j < dim; ++j) err += w[j] * b.x[r * dim + j];
    for (std::size_t j = 0; j < dim; ++j) grad[j] += err * b.x[r * dim + j] / static_cast<float>(b.n);
    loss += err * err / static_cast<float>(b.n);
  }
  ready({0, dim});
  return loss;
}

std::string train(ps::worker_context& ctx) {
  auto keys = ps::key_set::single({0, dim});
  if (ctx.id == 0) ctx.kv.init(keys, std::vector<float>(dim, 0.0f)).get();
  ctx.barrier();
  ps::batch_loader loader(ctx.sys, [id = ctx.id](std::uint64_t c) { return draw(1000 * c + id); });
  auto counter = ctx.sys.spawn(count_batches);
  ps::training_plan plan;
  plan.num_params = dim;
  plan.iterations = iterations;
  plan.compute = squared_loss;
  plan.batch_stages = {counter};
  plan.gradient_stages = {ctx.sys.spawn(clip_gradients)};
  auto stats = ps::run_training(ctx.kv, loader, plan);
  ctx.barrier();
  auto w = ctx.kv.pull(keys).get();
  ctx.barrier();
  caf::scoped_actor self{ctx.sys};
  std::uint64_t batches = 0, once = 0;
  self->request(counter, std::chrono::seconds(10), seen_atom::value)
    .receive([&](std::uint64_t b, std::uint64_t o) { batches = b, once = o; }, [](caf::error&) {});
  for (const auto& stage : {caf::actor_cast<caf::actor>(counter), caf::actor_cast<caf::actor>(plan.gradient_stages[0])})
    caf::anon_send_exit(stage, caf::exit_reason::user_shutdown);
  if (batches != iterations || once != iterations)
    throw std::runtime_error("the batch stage saw " + std::to_string(batches) + " batches, " + std::to_string(once) +
                             " clocks once, of " + std::to_string(iterations));
  for (std::size_t j = 0; j < dim; ++j)
    if (std::abs(w[j] - true_weight(j)) > 0.05f)
      throw std::runtime_error("weight " + std::to_string(j) + " is " + std::to_string(w[j]) + ", not " +
                               std::to_string(true_weight(j)));
  return nlohmann::json{{"worker", ctx.id}, {"batches_seen", batches}, {"loss", stats.last_loss}, {"right", true}}.dump();
}

}  // namespace

int main(int argc, char** argv) {
  return ps::run_app({"custom_stage", "linear regression through stages of the app's own", train, "sgd", "ssp",
                      [](const ps::node_config&) { return std::vector<ps::tensor_spec>{{"w", {0, dim}, {dim}}}; },
                      {}},
                     argc, argv);
}
