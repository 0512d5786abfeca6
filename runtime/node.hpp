#pragma once
// Process-level wiring (runtime/config.cpp, config_checks.cpp, job_settings.cpp, worker.cpp, launcher.cpp, roles.cpp) shared by psnode, train_fmnist, bench_kv and the tests: the
// configuration (CAF config: INI files plus --flags), the server and worker roles, and
// a launcher that runs a whole job either embedded (one process, no sockets) or as a
// local cluster of psnode processes on loopback.
#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/kv_client.hpp"
#include "libps/net/endpoint.hpp"
#include "libps/observe/progress.hpp"
#include "libps/sim/faults.hpp"
#include "libps/core/job_spec.hpp"
#include "libps/rows/row_store.hpp"
#include "libps/net/tcp_congestion.hpp"

namespace ps {

struct node_config;

// The rings a shard's process offers carry its pull answers. 8 MiB holds two whole pull
// chunks (--ps.chunk-bytes, 4 MiB), or a window of eight 1 MiB pulls from two shards: the
// shard writes the next answer while the reader copies one out, where in 2 MiB the two
// sides took turns sleeping for room (16 MiB pulls at window 8: 3-4 context switches a
// pull instead of 36-39). 16 MiB rings moved less again (BENCHMARKS.md, "Pull rings of 8 MiB").
inline constexpr std::size_t default_shm_ring_bytes = 8u << 20;

// A flag an app declares itself (app_definition::flags, runtime/app_registry.hpp): every
// program that can run the app takes --NAME=VALUE, and it is a job setting like any
// other (in the spec, compared with what a member was given, adopted when not given).
enum class app_flag_kind { count, number, counts, text };  // size_t, double, list of int64, string
struct app_flag {
  std::string name;      // without dashes: "clocks"
  app_flag_kind kind = app_flag_kind::count;
  std::string fallback;  // the default, as on the command line: "40", "0.5", "[]"
  std::string help;
  std::function<std::string(const node_config&)> check;  // what is wrong with the value ("": nothing)
};

// What a program's --help shows: its name, what it does, and the topics of flags it reads
// (runtime/help.cpp: "job", "addresses", "fmnist", "consistency", "wire", "checkpoints",
// "tables", "faults", "metrics") and the apps whose own flags it lists. --long-help
// still lists every option, CAF's included.
struct program_help {
  std::string name, synopsis;
  std::vector<std::string> topics;
  std::vector<std::string> apps;
};

struct node_config : caf::actor_system_config {
  program_help help;  // set before parse_args; empty name: CAF's text for --help
  // [global]: roles and the job.
  std::string role;             // coordinator | server | worker (psnode)
  std::string coordinator;      // HOST:PORT
  std::string layout;           // servers:S,workers:W: the role from a launcher's rank (runtime/launch_env.cpp)
  std::string rendezvous;       // FILE: under --layout, where rank 0 tells the others its address
  std::optional<std::size_t> launch_rank;  // the launcher's rank under --layout (status lines name it)
  std::string launch_job_id;    // the launcher's job, matched against the rendezvous file
  std::string host;             // --host: bind and advertised host at once ("": see endpoint_of)
  std::uint16_t port = 0;       // the port of --listen (0: any)
  std::string listen;           // ADDR:PORT this process binds ("": every interface, --port)
  std::string advertise;        // HOST[:PORT] others dial ("": the route to the coordinator)
  std::string app;              // worker app: fmnist | kvcheck | bench
  std::string cluster = "processes";  // embedded | processes
  std::size_t servers = 2;
  std::size_t workers = 2;
  // train_fmnist
  std::string model = "softmax";
  std::size_t epochs = 5;
  double lr = 0.1;
  std::size_t batch = 64;
  std::size_t seed = 1;
  std::string data = "/usr/share/datasets/fashion-mnist";  // fmnist: the dataset's directory
  // consistency and training stages
  std::string consistency;             // bsp | ssp | asp ("" : from --staleness, else bsp)
  std::int64_t staleness = -1;          // -1: not given
  std::string slow_worker;             // ID:FACTOR
  std::string straggle;                // P:FACTOR
  std::string pipeline = "on";         // on | off
  std::string trace;                   // FILE: consistency trace (JSON lines)
  double target_accuracy = 0.85;       // bench_consistency: seconds_to_target
  double eval_every = 0.25;            // seconds between parameter snapshots (time to target)
  // local devices and compression
  std::size_t devices = 1;             // compute devices per worker (CPU threads here)
  std::string aggregation = "block";   // central | block | ring (block: fastest on one memory, docs/running.md)
  std::string compression = "none";    // none | fp16 | int8 | topk
  double topk_ratio = 0.01;
  std::string pull_compression = "none";  // none | fp16 | int8
  // checkpoints
  std::string checkpoint_dir;
  std::size_t checkpoint_every = 0;    // clocks
  double checkpoint_seconds = 0;       // or every T seconds
  std::string restore;                 // DIR: start from its newest intact checkpoint
  bool restore_non_finite = false;     // restore one whose values hold NaN or Inf
  std::string state_dir;               // DIR: the coordinator saves what a restart needs here
  bool resume = false;                 // the coordinator takes over the job saved in --state-dir
  std::string on_sigterm = "stop";     // stop | step-down: what SIGTERM on psnode's coordinator does
  std::size_t replication = 1;         // copies of each shard (chain replication)
  // sparse tables' tiered store (servers)
  std::size_t shard_memory = 0;        // bytes of rows in RAM per shard (0: unlimited, no disk tier)
  std::string shard_dir = "/var/tmp";  // where the disk tier lives (a disk, not tmpfs)
  std::size_t disk_readers = row_store::default_readers;  // threads reading a shard's disk tier
  std::string eviction = "slru";       // lru | slru
  std::string handoff = "copy-ahead";  // copy-ahead | cut: how tiered rows move in a map change
  // fault injector (libps/sim/faults.hpp)
  std::string faults;
  // [ps]: tuning.
  std::string rule;  // empty: the app's default
  std::string rule_params;  // the rule's own hyper-parameters, "NAME=VALUE,..."
  double momentum = 0.0;
  std::size_t chunk_bytes = 4u << 20;
  std::size_t push_chunk_bytes = 1u << 20;  // pushes: the smaller of the two (libps/keys/chunking.hpp)
  std::size_t inflight_bytes = 8u << 20;
  std::size_t crowded_inflight_bytes = default_crowded_inflight_bytes;  // libps/net/host_share.hpp
  std::size_t tcp_push_chunk_bytes = default_tcp_push_chunk_bytes;      // libps/net/host_share.hpp
  std::string transport = "shm";  // the data plane's transport, by name (actors/transport/registry.cpp)
  std::size_t data_plane_bytes = 64u << 10;  // BENCHMARKS.md, "The data plane from 64 KiB"
  std::size_t shm_ring_bytes = default_shm_ring_bytes;  // data-plane rings in shared memory on one host (0: none)
  std::size_t shm_push_ring_bytes = 4u << 20;  // the rings workers offer: their pushes (BENCHMARKS.md)
  std::size_t direct_requests = 1;        // workers' requests over the data connections (0: through CAF)
  std::size_t caller_runs = 1;  // the caller's thread runs the client actor (kv_client_options::dispatch_on_caller)
  std::uint64_t busy_poll_us = 200;       // data-connection readers poll this long before they sleep (BENCHMARKS.md)
  std::string tcp_congestion = default_tcp_congestion;  // data connections' (libps/net/tcp_congestion.hpp)
  std::uint16_t data_plane_port = 0;  // 0: any free port
  std::size_t timeout_ms = 30000;
  std::int64_t retry_ms = -1;  // -1: 200 with message faults, else never
  std::size_t heartbeat_ms = 1000;        // 0: no heartbeats (a hung peer is found by request timeouts only)
  std::size_t failure_timeout_ms = 10000;  // a peer silent this long is declared dead
  std::size_t register_timeout_ms = 60000;
  std::string out;              // export: the directory the .npy files go to
  std::string job_file;         // a coordinator's job from a file (runtime/job_file.hpp) instead of its app
  // security: members prove a shared secret (runtime/guarded_net.hpp); TLS via CAF's OpenSSL module
  std::string log_level = "info";  // error | warning | info | debug (libps/observe/log.hpp)
  std::string secret_file;
  std::string tls_cert, tls_key, tls_ca;
  std::size_t max_message_bytes = 512u << 20;  // largest CAF message a peer may announce
  std::string metrics;          // FILE: the observer's JSON lines (per epoch, every metrics_ms)
  std::size_t metrics_ms = 2000;
  std::uint16_t metrics_port = 0;  // Prometheus' text format on this port (0: off)
  std::uint16_t health_port = 0;   // /healthz and /readyz for a scheduler's probes (0: off)
  std::size_t wait_report_ms = 5000;  // while members are missing, the coordinator says who
  std::size_t barrier_timeout_ms = 600000;
  std::size_t vnodes = 128;
  std::size_t bucket_bits = 12;
  std::size_t reply_delay_ms = 0;

  node_config();
  // The registered apps' own flags, by name (declared when parse_args runs).
  std::size_t app_count(const std::string& name) const;
  double app_number(const std::string& name) const;
  const std::vector<std::int64_t>& app_counts(const std::string& name) const;
  const std::string& app_text(const std::string& name) const;
  // The text of app flag `name`'s value, as the job spec holds it, and setting it from
  // such a text (bad_request when it does not parse).
  std::string app_flag_text(const std::string& name) const;
  void set_app_flag(const std::string& name, const std::string& text);
  bool declared(const std::string& name) const;  // an app flag of that name is declared
  // help's text: each topic's flags with their descriptions and defaults.
  std::string help_text() const;
  // --dump-config: every option's effective value as an INI file (--config-file reads it
  // back), with the update rule and consistency the app's defaults make of them.
  std::string effective_config() const;
  // Where this process listens and what members are told to dial (--listen, --advertise,
  // --host, --port). A member whose flags leave the advertised host open gets the local
  // address of its route to --coordinator, right on any routed network.
  endpoint endpoint_of() const;
  // Bytes of each shared-memory ring this process's data plane offers its peers (0: none).
  // What a process writes goes through the ring it offers: a worker's carries its pushes.
  std::size_t offered_ring_bytes() const;
  // Parses flags and the INI file; unlike plain CAF, an unknown key or a value of the
  // wrong type in the INI file is an error. Prints the error and returns false.
  bool parse_args(int argc, char** argv);
  // Range checks on the values; throws bad_request naming the option.
  void validate() const;
  void validate_wire() const;         // part of validate
  void validate_metrics() const;      // part of validate
  void validate_disk_tier() const;    // part of validate
  void validate_training() const;     // part of validate
  void validate_checkpoints() const;  // part of validate
  void validate_state_dir() const;    // part of validate_checkpoints
  void validate_security() const;     // part of validate
  void declare_member_options();       // parts of the constructor: the global group,
  void declare_training_options();     // by concern,
  void declare_durability_options();
  void declare_tuning_options();       // and the [ps] group
  // The fault plan --faults selects (checked against the cluster size).
  fault_plan fault_spec() const;
  // The push codec --compression and --topk-ratio select.
  codec push_codec() const;
  // The pull codec --pull-compression selects (top-k refused).
  codec pull_codec() const;
  // The staleness bound the flags select (libps/core/consistency.hpp); app_default
  // ("bsp", "asp", ...) applies when neither --consistency nor --staleness is given.
  std::uint64_t staleness_bound(const std::string& app_default) const;
  // The arguments this process was started with (for starting psnode children).
  std::vector<std::string> args;
  // The options given on the command line or in the INI file ("model", "ps.vnodes"):
  // job settings among them are compared with the job's, the others adopted from it.
  std::set<std::string> given;

 private:
  // CAF's parser error for a bad value, in plain words naming the flag and what it takes.
  std::string explain_parse_error(const caf::error& err) const;
  void declare(const app_flag& flag);
  std::map<std::string, std::size_t> app_count_values_;
  std::map<std::string, double> app_number_values_;
  std::map<std::string, std::vector<std::int64_t>> app_counts_values_;
  std::map<std::string, std::string> app_text_values_;
};

// Sets CAF defaults that suit this machine kind unless the user set them
// (see docs/wire-and-caf.md, "Scheduler").
void apply_runtime_defaults(node_config& cfg);

struct worker_context {
  caf::actor_system& sys;
  const node_config& cfg;
  std::uint32_t id;
  std::uint32_t num_workers;
  const cluster_view& view;
  kv_client& kv;
  std::uint64_t start_clock;                     // > 0: joined a running job at this clock
  std::function<void()> barrier;                 // all live workers; throws kv_error on failure
  std::function<void(std::string)> report;       // progress, shown by the launcher
};

// Reports progress to the job's observer with the worker's push and pull latencies since
// its last report (its client measures them).
void report_progress(worker_context& ctx, progress_report r);

// A worker app: runs on a registered worker, returns a one-line JSON result.
using app_fn = std::function<std::string(worker_context&)>;

struct job_result {
  bool ok = false;
  errc code = errc::failed;  // how it ended when not ok (job_failed, refused, a stop)
  std::string reason;        // why it ended so
  std::map<std::uint32_t, std::string> results;  // worker id -> its JSON result
  std::vector<std::string> failures;
  std::vector<std::string> faults_seen;  // processes the fault injector killed, as planned
  std::vector<update_loss> losses;       // updates lost with dead shards, per shard and worker
  std::shared_ptr<const partitioner> map;  // the shard map at the end, when it changed while the job ran
  double seconds = 0;
  bool stopped() const;  // on request (operator, SIGINT, SIGTERM)
};

// What the caller of a launcher hears while the job runs (the observer's events as they
// come; results, losses and failures also land in job_result). Unset: printed to stderr.
struct job_listener {
  std::function<void(std::uint32_t worker, const std::string& text)> progress;  // a worker's progress line
  std::function<void(const std::string& text)> news;  // failovers, joins, departures, checkpoints, losses
  // Each --metrics line also goes here (--metrics-port's exporter); unset: none.
  std::function<void(const nlohmann::ordered_json& line)> metrics_line = {};
};

// Collects a coordinator's events (from its observer) into res until it ends or a failure
// arrives; asks it to stop on SIGINT/SIGTERM (runtime/signals); runs tick every 100 ms.
// Without listener.progress, progress is shown per runtime/job_progress (cfg.workers,
// cfg.metrics).
// True when the coordinator ended (res.code: its reason).
bool watch_coordinator(caf::scoped_actor& observer, const coordinator_actor& coord, job_result& res,
                       const job_listener& listener, const node_config& cfg, const std::function<void()>& tick = {});

// Runs app `app_name` on cfg.workers workers and cfg.servers shards, embedded or as
// psnode processes (cfg.cluster). Never hangs on a dead member: it fails with a reason.
// app_name is what psnode children get as --app.
// What the coordinator hands every member besides the shard map.
struct job_settings {
  update_rule rule;
  std::uint64_t staleness = 0;
  job_spec spec;  // the job contract (runtime/job_contract.hpp builds it)
  std::uint32_t bucket_bits = 12;  // --ps.bucket-bits, else sized to the spec's tensors
  std::vector<sparse_table_spec> tables = {};  // the app's sparse tables (rows by id), by index
};
// From --ps.rule/--lr/--ps.momentum and --consistency/--staleness, with an app's defaults.
job_settings settings_from(const node_config& cfg, const std::string& default_rule,
                           const std::string& default_consistency);

job_result run_job(caf::actor_system& sys, const node_config& cfg, const app_fn& app,
                   const std::string& app_name, const job_settings& settings, const job_listener& listener = {});

// Registers a worker with the coordinator, connects to the shards, runs the app and
// sends its result (done). False (and *error_out) when any step failed.
// on_spec gets the job's spec before the app starts (psnode adopts its settings there).
// A refused or failed worker's error is an errc (*error_out has its text). A worker process
// told to stop leaves the job at its next tick: its result and *left_out say so, and it is
// no failure.
using spec_fn = std::function<void(const job_spec&)>;
bool run_worker(caf::actor_system& sys, const node_config& cfg, coordinator_actor coord,
                const app_fn& app, std::string* error_out, std::shared_ptr<transport> plane = nullptr,
                const spec_fn& on_spec = {}, errc* code_out = nullptr, std::string* left_out = nullptr);
// This process's data plane per --ps.transport and --ps.data-plane-bytes (none when 0);
// throws bad_request when it cannot listen on --host.
std::shared_ptr<transport> transport_from(caf::actor_system& sys, const node_config& cfg);
// The program a local cluster of processes starts as its servers and workers: psnode next
// to this executable unless set (an app's own binary sets itself: runtime/app_main.hpp),
// with `leading` before its flags (an interpreter's script: python3 train.py --role=...).
void set_child_program(std::string path, std::vector<std::string> leading = {});
const std::string& child_program();
// Starts the child program (build/bin/psnode by default) with these arguments.
pid_t spawn_psnode(const std::vector<std::string>& args);

// A JSON line a program prints: fields in the order they were added.
using json_line = nlohmann::ordered_json;

// Prints a program's last stdout line: `line` with "status" (ok, failed, stopped) and, when
// not ok, "reason". Returns the exit status for that end (docs/configuration.md, "Exit status").
int print_status(json_line line, bool ok, errc code, const std::string& reason);
// The end of a training program's job: its failures on stderr and the last line, with
// the workers' figures (add_figures) when the job completed.
int print_job_end(json_line line, const job_result& res, const std::function<void(json_line&)>& add_figures);

// psnode roles. Return the process exit code; throw bad_request for settings they cannot
// use (--host the data plane cannot listen on), which psnode reports.
int run_coordinator_role(caf::actor_system& sys, const node_config& cfg, const job_settings& settings,
                         const job_listener& listener = {});
int run_server_role(caf::actor_system& sys, const node_config& cfg);
int run_worker_role(caf::actor_system& sys, node_config& cfg, const app_fn& app);
// The whole job of cfg.app on this machine (cfg.cluster): progress and recovery events on
// stderr, each worker's JSON result and then a summary line on stdout.
int run_local_role(caf::actor_system& sys, const node_config& cfg, const app_fn& app, const job_settings& settings,
                   const job_listener& listener = {});
// The newest intact checkpoint in --checkpoint-dir as .npy files in --out (names and shapes
// from the app's spec when --app is given); one JSON line.
int run_export_role(const node_config& cfg, const job_settings& settings);

// The update rule from the config (--ps.rule, else default_rule; --lr, --ps.momentum).
update_rule rule_from(const node_config& cfg, const std::string& default_rule);

// --slow-worker=ID:FACTOR and --straggle=P:FACTOR; throw bad_request naming the flag.
struct slow_worker_spec {
  bool set = false;
  std::uint32_t worker = 0;
  double factor = 1;
};
slow_worker_spec parse_slow_worker(const std::string& s);
struct straggle_spec {
  double probability = 0;
  double factor = 1;
};
straggle_spec parse_straggle(const std::string& s);


}  // namespace ps
