#pragma once
// Pipelined training stages, composed by a training app:
//
//   loader (actor, own thread) -> [batch stages] -> compute (the worker's thread, with the
//   parameters from the pull stage, the kv_client actor) -> [gradient stages]
//     -> push (kv_client actor, per tensor as soon as backward produces it, last layer first)
//
// The stages in brackets are the app's own typed actors, in the order the plan lists them
// (none by default): a batch stage sees every batch before compute and may change it, a
// gradient stage sees every finished span before it is pushed and may change its values.
//
// With pipelining on, the loader prepares batch c+1 while batch c computes, each tensor's
// gradient is pushed the moment it is final (while earlier layers are still computed),
// and the pull of iteration c+1 is sent right after the clock tick of iteration c, so it
// is answered as soon as the staleness controller allows, while the worker finishes up.
// With it off, every stage waits for the one before: load, pull, compute, push, ack, tick.
// Either way the consistency guarantee is the shards' (libps/core/consistency.hpp): pushes of
// iteration c carry clock c, the tick to c+1 follows them, the pull at c+1 follows that.
#include <chrono>
#include <future>
#include <random>
#include <span>

#include "actors/kv_client.hpp"

namespace ps {

// One minibatch of labelled samples (features row-major). Labels are floats: class ids,
// 0/1 clicks and regression targets alike (integers are exact up to 2^24).
struct sample_batch {
  std::vector<float> x;
  std::vector<float> y;
  std::size_t n = 0;
};

// The loader stage: an actor that builds batches on request, on a thread of its own
// (reading and decoding block). own_thread = false: a scheduled actor instead, the
// deterministic stand-in a test runs with its scheduler.
class batch_loader {
 public:
  using make_fn = std::function<sample_batch(std::uint64_t clock)>;
  batch_loader(caf::actor_system& sys, make_fn make, bool own_thread = true);
  ~batch_loader();
  batch_loader(const batch_loader&) = delete;
  batch_loader& operator=(const batch_loader&) = delete;
  // The batch of iteration `clock`, built while the caller does other work.
  std::future<sample_batch> request(std::uint64_t clock);
  caf::actor_system& system() const { return *sys_; }

 private:
  caf::actor_system* sys_;
  caf::actor actor_;
};

// Where a tensor's gradient lives in the flat gradient vector (and its keys: base+offset).
struct tensor_span {
  std::size_t offset = 0, size = 0;
};

// A finished span of an iteration's gradient, handed to a gradient stage: values() may be
// changed in place until the stage replies (the push leaves after that).
struct gradient_span {
  std::shared_ptr<std::vector<float>> buffer;
  tensor_span span;
  std::span<float> values() const { return std::span<float>(*buffer).subspan(span.offset, span.size); }
};

using stage_atom = caf::atom_constant<caf::atom("stage")>;
// A stage of the app's own between the loader and compute: gets iteration `clock`'s batch
// and replies with the batch compute is to get (the same, changed, or another).
using batch_stage = caf::typed_actor<caf::replies_to<stage_atom, std::uint64_t, sample_batch>::with<sample_batch>>;
// A stage of the app's own between compute and the push: gets each finished span of
// iteration `clock`'s gradient, may change its values, and replies with the span.
using gradient_stage = caf::typed_actor<caf::replies_to<stage_atom, std::uint64_t, gradient_span>::with<gradient_span>>;

// Simulated slow compute, for consistency experiments: the factor by which worker w's
// compute is stretched in an iteration (--slow-worker: always; --straggle: at random,
// from a generator seeded by --seed and the worker id).
class straggler_model {
 public:
  straggler_model(std::uint32_t worker, std::uint64_t seed, std::uint32_t slow_worker, double slow_factor,
                  double straggle_p, double straggle_factor);
  double factor_for_next_iteration();

 private:
  double persistent_ = 1, p_ = 0, transient_ = 1;
  std::mt19937_64 rng_;
};

struct training_plan {
  key_type base = 0;            // parameter i is key base + i
  std::size_t num_params = 0;
  std::uint64_t iterations = 0;
  std::uint64_t first_clock = 0;  // a worker that joined a running job starts there
  bool pipelined = true;
  // Forward/backward: fills grad and returns the loss; calls ready with each span of grad
  // as soon as it is final (every span exactly once). grad is a view of num_params zeroed
  // floats the library owns: pushes in flight read it, and a view cannot be resized or
  // handed other memory. A span reported twice or past the parameters is refused before
  // anything of it is sent.
  std::function<float(const std::vector<float>& params, const sample_batch& batch, std::span<float> grad,
                      const std::function<void(tensor_span)>& ready)>
    compute;
  // Called after each iteration's compute with the parameters it used (progress, snapshots).
  std::function<void(std::uint64_t clock, const std::vector<float>& params, float loss)> after_iteration;
  // The app's own stages, each given every batch (every span) in this order. A stage that
  // fails, ends or does not reply within stage_timeout fails the worker, naming it.
  std::vector<batch_stage> batch_stages;
  std::vector<gradient_stage> gradient_stages;
  std::chrono::milliseconds stage_timeout{60000};
};

struct training_stats {
  std::uint64_t iterations = 0;
  double seconds = 0;
  double compute_seconds = 0;  // forward/backward, stretch included
  double wait_seconds = 0;     // waiting for parameters (the staleness gate and the network)
  float last_loss = 0;
};

// Runs the iterations from plan.first_clock to plan.iterations; throws kv_error when a
// request fails.
training_stats run_training(kv_client& kv, batch_loader& loader, straggler_model& stragglers,
                            const training_plan& plan);
// The same without simulated slow compute.
training_stats run_training(kv_client& kv, batch_loader& loader, const training_plan& plan);

}  // namespace ps

// Local messages only: stages live in the worker's process.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ps::sample_batch)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ps::gradient_span)
