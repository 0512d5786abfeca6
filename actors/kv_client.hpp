#pragma once
// The worker-side key-value API. push/pull split keys across shards and into bounded
// chunks, send them from one event-based client actor (many requests in flight), and
// return a kv_future the caller can wait on or chain. Every request has a finite
// timeout and every shard is monitored: a dead or silent shard fails the request with
// an error naming the shard and the keys, never a hang.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/reconnect.hpp"
#include "libps/observe/latency.hpp"
#include "libps/keys/chunking.hpp"
#include "libps/net/host_share.hpp"
#include "libps/core/codec.hpp"
#include "libps/net/done_signal.hpp"
#include "libps/sim/faults.hpp"
#include "libps/keys/partitioner.hpp"
#include "libps/core/job_spec.hpp"

namespace ps {

class transport;  // actors/transport.hpp: the client holds its process's, if any

enum class op_kind { push, init, pull, clock };

struct kv_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown by a clock tick when kv_client_options::leave_requested says so: the worker's app
// ends there and the worker leaves the job (runtime/worker.cpp). Not a kv_error, so an app's
// handler of failed requests does not swallow it.
struct worker_leaving : std::runtime_error {
  worker_leaving(std::uint64_t before_clock, const std::string& what)
      : std::runtime_error(what), clock(before_clock) {}
  std::uint64_t clock;  // the tick not sent: the worker's pushes of clocks below it count
};

// Shared state of one push, pull or init.
struct kv_op_state : std::enable_shared_from_this<kv_op_state> {
  std::mutex mtx;       // guards error, values and continuation until done
  done_signal done;     // set once, under mtx; waiters sleep on it
  std::string error;                 // empty on success
  std::vector<float> values;         // pull result
  std::function<void()> continuation;
  std::size_t pending = 0;           // chunks not yet answered (client actor only)
  std::string what;                  // "pull of keys [0, 10)": for errors
  // Where the op's latency goes when it succeeds (none: not measured, e.g. init).
  std::shared_ptr<latency_recorder> latency;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  // Completes the op once; later calls are ignored. Runs the continuation.
  void finish(std::string err);
  bool done_flag();
};

class kv_future {
 public:
  kv_future() = default;
  explicit kv_future(std::shared_ptr<kv_op_state> st) : st_(std::move(st)) {}

  bool ready() const;
  void wait() const;
  // Waits; false if still pending after d.
  bool wait_for(std::chrono::milliseconds d) const;
  // Waits; empty when the op succeeded, else what went wrong.
  std::string error() const;
  // Waits; throws kv_error on failure; returns the pulled values (empty for push/init).
  std::vector<float> get();
  // Waits; the op's values whatever its outcome: a pull into a caller's buffer hands that
  // buffer back even when it failed (its contents then unspecified). Check error() too.
  std::vector<float> take_values();
  // Runs f once the op completes (at once if it already has). f runs where the client
  // actor runs, a scheduler thread or a data-plane reader thread (inline_runner): keep
  // it short and never block in it.
  void then(std::function<void(kv_future)> f);

 private:
  std::shared_ptr<kv_op_state> st_;
};

struct kv_client_options {
  std::uint32_t worker = 0;
  std::uint64_t chunk_bytes = default_chunk_bytes;
  std::chrono::milliseconds timeout{30000};
  // Bytes of chunks in flight per shard before further chunks wait in the client.
  std::uint64_t inflight_bytes = 8u << 20;
  // Compression of pushes on the wire (init stays exact; pulls: pull_compression).
  codec compression{};
  // Where new shard maps come from after a failover. None: a dead shard fails its
  // requests at once.
  coordinator_actor coordinator{};
  // Fault injector: this process dies abruptly when the worker ticks to this clock.
  std::optional<std::uint64_t> kill_at{};
  // A request unanswered this long is sent again (0: never; requests are not lost on
  // TCP, but the fault injector's drop loses them). Duplicates are filtered by the shards.
  std::chrono::milliseconds retry{0};
  // The fault injector's message faults (drop, duplicate, delay) for this client's requests.
  fault_plan faults{};
  // This process's data plane: large pushes leave and large pulls arrive through it, and,
  // when it takes messages (--ps.direct-requests), the requests and answers themselves
  // (then not under message faults, which act on CAF messages). None: all inside CAF.
  std::shared_ptr<transport> plane{};
  // Compression of pull answers (none, fp16 or int8; parameters are not top-k material).
  // Compressed answers come inside the messages, not over the data plane.
  codec pull_compression{};
  // Dials a shard that joined at host:port (blocking; run on a thread of its own). Until
  // it returns, messages to the shard go through the coordinator's node, which told of it;
  // after, CAF takes the direct connection. None: they keep going through there.
  std::function<void(const std::string&, std::uint16_t)> dial{};
  // When the coordinator goes down: dial its address again and rejoin a coordinator that
  // resumed the job there (barriers and the worker's result wait meanwhile). No dial: it
  // is gone for good at once.
  reconnect_options reconnect{};
  caf::actor worker_handle{};  // the worker the coordinator tells when the job ends (a rejoin names it)
  std::uint64_t first_barrier = 0;  // the registration's barrier_generation: this worker's next barrier
  // Pushes and inits are cut at the smaller of this and chunk_bytes (pulls at chunk_bytes).
  std::uint64_t push_chunk_bytes = default_push_chunk_bytes;
  // inflight_bytes' cap for shards reached over TCP while this process and its peers on its
  // host outnumber the host's CPUs (transport::host_crowded; libps/net/host_share.hpp).
  std::uint64_t crowded_inflight_bytes = default_crowded_inflight_bytes;
  // Pushes and inits are cut at the smaller of this and chunk_bytes_of while the host is
  // not crowded and some shard is reached over TCP (libps/net/host_share.hpp).
  std::uint64_t tcp_push_chunk_bytes = default_tcp_push_chunk_bytes;
  // The thread that calls push/pull runs the client actor for its request when the actor
  // is idle, instead of waking a scheduler thread for it (kv_client.cpp, dispatch_here).
  // false: the scheduler's thread always does.
  bool dispatch_on_caller = true;
  // The job's dense tensors (its spec's): a push, init or pull of keys outside all of them
  // is refused before anything is sent, naming the nearest. Empty: no check.
  std::vector<tensor_spec> tensors{};
  // Asked before each tick (advance_clock, push_and_advance): true, and the tick is not
  // sent but worker_leaving thrown (a worker process told to stop leaves at a clock
  // boundary). None: never.
  std::function<bool()> leave_requested{};

  // The largest value payload of one message of this kind.
  std::uint64_t chunk_bytes_of(op_kind kind) const {
    return kind == op_kind::pull ? chunk_bytes : std::min(chunk_bytes, push_chunk_bytes);
  }
};

// One connected shard: its id, a name for errors, and its handle.
struct shard_link {
  std::uint32_t id;
  std::string name;  // "shard 1 (127.0.0.1:40001)"
  shard_actor handle;
};

// What the client learned about the cluster while it ran, for the app's thread.
struct kv_cluster_events {
  std::mutex mtx;
  // Failovers: milliseconds from learning that a shard died to the first pull its
  // replacement (or the rest of its chain) answered.
  std::vector<double> recoveries_ms;
  // The workers still running (joins and departures), empty until the coordinator says.
  std::vector<std::uint32_t> live_workers;
  // Notified whenever live_workers or map changes (kv_client::await_live_workers, await_map).
  std::condition_variable changed;
  // Shards whose chain has a new head since connecting (a failover), by id.
  std::map<std::uint32_t, shard_actor> new_heads;
  // Shards that joined since connecting.
  std::vector<shard_link> joined;
  // The map requests are planned by: the view's at first, then each newer map the
  // coordinator sends when a shard joins (the client actor replaces it).
  std::shared_ptr<const partitioner> map;
  // Requests sent to shards through CAF rather than over a data connection (written by the
  // client actor alone).
  std::atomic<std::uint64_t> caf_requests{0};
};


class kv_client {
 public:
  kv_client(caf::actor_system& sys, const cluster_view& view, std::vector<shard_link> shards,
            kv_client_options opts);
  ~kv_client();
  kv_client(const kv_client&) = delete;
  kv_client& operator=(const kv_client&) = delete;

  // values holds keys.num_keys() floats, in key order. Sums (or applies the server's
  // update rule to) them into the stored parameters.
  kv_future push(const key_set& keys, std::vector<float> values);
  // The same without giving up the buffer: it is shared with the messages (no copy), so
  // the caller must not change it before the future completes. For values pushed again
  // and again (benchmarks, constant tensors).
  kv_future push(const key_set& keys, std::shared_ptr<std::vector<float>> values);
  // The values for keys start at values[offset] (e.g. one layer of a flat gradient); the
  // buffer may hold more after them. The same sharing rule applies.
  kv_future push(const key_set& keys, std::shared_ptr<std::vector<float>> values, std::size_t offset);
  // The same push, then this worker's clock advances to then_tick on every shard, as
  // advance_clock(then_tick) would: the tick rides on the push's last message to each
  // shard it reaches (one request fewer per shard and iteration).
  kv_future push_and_advance(const key_set& keys, std::shared_ptr<std::vector<float>> values, std::size_t offset,
                             std::uint64_t then_tick);
  // Sets keys that were never set (the first initializer wins).
  kv_future init(const key_set& keys, std::vector<float> values);
  // The current values of the keys, in key order.
  kv_future pull(const key_set& keys);
  // The same, landing in `into` (resized to the keys), which get() hands back: a loop that
  // passes its buffer from one pull to the next (buf = kv.pull(keys, std::move(buf)).get())
  // touches no fresh memory. On this VM a fresh 64 MiB result costs ~200 ms of page faults,
  // 60 times its transfer at window 8 (BENCHMARKS.md).
  kv_future pull(const key_set& keys, std::vector<float> into);

  // Rows `ids` of sparse table `table` (the job's tables, by index): ids.size() * dim
  // floats, in the order asked (an id may repeat). Rows never touched are created on
  // their shard from (seed, table, id). Throws bad_request for an unknown table.
  kv_future pull_rows(std::uint32_t table, const std::vector<std::uint64_t>& ids);
  // Folds grads (ids.size() * dim floats) into the rows with the table's rule; repeated
  // ids are summed here first, so each row gets one update per push. Throws bad_request
  // for an unknown table or a wrong gradient count.
  kv_future push_rows(std::uint32_t table, const std::vector<std::uint64_t>& ids, const std::vector<float>& grads);
  // Tells the rows' shards that they will be pulled soon, so those with a disk tier read
  // them into RAM meanwhile (a hint: nothing is answered). Throws bad_request for an
  // unknown table.
  void prefetch_rows(std::uint32_t table, const std::vector<std::uint64_t>& ids);
  // The dimension of table `table` (throws bad_request for an unknown one).
  std::uint32_t table_dim(std::uint32_t table) const;

  // This worker has completed c iterations: tags later requests with clock c and tells
  // every shard, after this worker's earlier requests to it (the staleness controller
  // counts on that order). Completes when every shard has acknowledged.
  kv_future advance_clock(std::uint64_t c);
  // This worker has finished its iterations: it leaves every shard's clock vector, behind
  // its earlier requests, so BSP and SSP reads stop waiting for it.
  kv_future leave_clock_vector();
  // Waits until every running worker has reached this barrier (the coordinator's). Throws
  // kv_error when it fails: its timeout passed, the job ended, or the coordinator went down
  // (known at once: the client watches it).
  void barrier(std::chrono::milliseconds timeout);
  // A progress line for the job's observer, through the coordinator (dropped while the
  // coordinator is away).
  void report(std::string text);
  // The worker's end, to the coordinator; waits for its acknowledgment (across a
  // coordinator's restart). Throws kv_error when it cannot be delivered.
  void finish(worker_result result);
  // Tags later requests with this clock without telling the shards (tests).
  void set_clock(std::uint64_t c) { clock_ = c; }
  std::uint64_t clock() const { return clock_; }
  // Push and pull latencies (rows included) since the last call, for progress reports.
  std::pair<latency_summary, latency_summary> take_latencies();
  // The map requests are planned by now (a copy: shards that join change it).
  partitioner map() const { return *current_map(); }
  const kv_client_options& options() const { return opts_; }
  // Waits until no data connection to a shard copy is still being set up (each is up,
  // refused, or its shard gone), at most `timeout`; the number of copies connected. With
  // no data plane, 0 at once. Requests that leave after it, on a route with nothing in
  // flight, go over the connections that are up (--ps.direct-requests).
  std::uint64_t await_data_connections(std::chrono::milliseconds timeout);
  // Requests sent to shards through CAF so far, rather than over a data connection.
  std::uint64_t requests_through_caf() const { return stats_->caf_requests.load(std::memory_order_relaxed); }
  std::vector<double> recovery_times_ms() const;
  // The running workers as last heard from the coordinator (initially 0..num_workers-1).
  std::vector<std::uint32_t> live_workers() const;
  // Waits until at least n workers are live (a joiner registered), at most `timeout`;
  // whether they are.
  bool await_live_workers(std::size_t n, std::chrono::milliseconds timeout) const;
  // Waits until the shard map the client plans by (joins, departures) satisfies `holds`, at
  // most `timeout`; whether it does. `holds` runs under the client's lock: it must not call
  // this client.
  bool await_map(const std::function<bool(const partitioner&)>& holds, std::chrono::milliseconds timeout) const;
  // Each shard's figures (server_shard's stats: rows, tiers, its process's peak memory
  // and disk reads), one JSON object per shard, as first connected. Blocks; throws
  // bad_request naming a shard that does not answer.
  std::vector<std::string> shard_stats() const;
  // The answers the client actor still awaits (its CAF response handlers). Reads the
  // actor's state from outside: only for tests on CAF's deterministic scheduler.
  std::size_t awaited_answers() const;
  // The shards as first connected, with the heads of chains that failed over since and
  // the shards that joined.
  std::vector<shard_link> current_shards() const;
  // Benchmarks: rows 0..count-1 of `table` made on their shards as first touch makes them
  // (on disk where shards have a disk tier). Blocks; returns the rows made; throws
  // bad_request naming a shard that fails.
  std::uint64_t fill_rows(std::uint32_t table, std::uint64_t count) const;

 private:
  kv_future send(op_kind kind, const key_set& keys, std::shared_ptr<std::vector<float>> values,
                 std::optional<std::size_t> offset = {},  // none: values fit keys exactly
                 std::uint64_t then_tick = 0, std::optional<std::vector<float>> pull_into = {});
  // What the request is ("push of keys [0, 10)"), once its sizes and keys are checked:
  // throws bad_request for values that do not fit the keys or keys outside the tensors.
  std::string checked_request(op_kind kind, const key_set& keys, const std::vector<float>* values,
                              std::optional<std::size_t> offset) const;
  // The fault injector's kill of this worker at clock c (its pushes so far count).
  void die_if_killed_at(std::uint64_t c);
  // worker_leaving instead of the tick to c, when opts_.leave_requested says so.
  void leave_if_asked(std::uint64_t c) const;

  kv_future send_rows(op_kind kind, std::uint32_t table, const std::vector<std::uint64_t>& ids, const float* grads);

  std::shared_ptr<const partitioner> current_map() const;
  // The chunk size of a request of this kind and number of values planned now
  // (opts_.tcp_push_chunk_bytes).
  std::uint64_t chunk_bytes_now(op_kind kind, std::uint64_t values) const;

  std::vector<sparse_table_spec> tables_;  // the job's sparse tables, by index
  kv_client_options opts_;
  // Top-k error feedback: the residual of each chunk of each tensor pushed, by (first
  // key, chunk index). Chunks of a key set are the same every time, so each residual
  // follows one piece of one tensor across pushes.
  std::map<std::pair<key_type, std::size_t>, topk_residual> residuals_;
  std::shared_ptr<kv_cluster_events> stats_ = std::make_shared<kv_cluster_events>();
  client_actor actor_;
  caf::actor_system& sys_;
  std::vector<shard_link> shards_;
  std::uint64_t clock_ = 0;
  std::shared_ptr<latency_recorder> push_latency_ = std::make_shared<latency_recorder>();
  std::shared_ptr<latency_recorder> pull_latency_ = std::make_shared<latency_recorder>();
};

}  // namespace ps
