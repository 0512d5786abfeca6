// node_config: its flags and INI files, parsed, and the apps' own flags (their checks:
// config_checks.cpp; what they give the roles: job_settings.cpp).
#include "runtime/node.hpp"

#include <caf/io/all.hpp>

#include <arpa/inet.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <filesystem>

#include "actors/server_shard.hpp"
#include "libps/rows/row_disk.hpp"
#include "libps/rows/row_tier.hpp"
#include "libps/observe/log.hpp"
#include "libps/net/secret.hpp"
#include "libps/net/tcp_congestion.hpp"
#include "runtime/tls_stream.hpp"
#include "libps/observe/text.hpp"
#include "runtime/app_registry.hpp"
#include "runtime/job_contract.hpp"
#include "runtime/launch_env.hpp"

namespace ps {

using std::chrono::milliseconds;

// ---- configuration ------------------------------------------------------------------

node_config::node_config() {
  register_types(*this);
  load<caf::io::middleman>();
  declare_member_options();
  declare_training_options();
  declare_durability_options();
  declare_tuning_options();
}

// Who this process is, where it listens and whom it trusts.
void node_config::declare_member_options() {
  opt_group{custom_options_, "global"}
    .add(role, "role", "psnode role: coordinator|server|worker|local|export|describe (local: the whole job of --app "
                       "here; export: --checkpoint-dir's newest checkpoint as .npy files in --out; describe: the "
                       "job as a job file on stdout, for --job-file)")
    .add(out, "out", "export: DIR the .npy files and manifest.json go to")
    .add(job_file, "job-file", "FILE: a coordinator's job (app, tensors, tables, settings) from a job file that the "
                               "app's program wrote with --role=describe, so it need not run the app")
    .add(coordinator, "coordinator", "coordinator address HOST:PORT")
    .add(layout, "layout", "servers:S,workers:W: one identical command on every rank of srun/sbatch or mpirun runs the "
                           "job: rank 0 coordinates, ranks 1..S serve, the rest work (ranks from SLURM_PROCID, "
                           "OMPI_COMM_WORLD_RANK or PMI_RANK; under Slurm the coordinator is the first host of the job "
                           "at --port, default 7070; docs/clusters.md)")
    .add(rendezvous, "rendezvous", "FILE: under --layout, rank 0 writes its address there and the others wait for it "
                                   "(a directory every rank sees; how MPI ranks find the coordinator)")
    .add(host, "host", "HOST: listen on it and announce it (both; --listen and --advertise win)")
    .add(port, "port", "the port of --listen (0: any free port)")
    .add(listen, "listen", "ADDR:PORT this process listens on (default every interface; :PORT for every interface)")
    .add(advertise, "advertise", "HOST[:PORT] other members dial (default: this host's address on its route to "
                                 "--coordinator)")
    .add(log_level, "log-level", "error|warning|info|debug: what this process says on stderr (info: the job's news "
                                 "and per-epoch summaries; warning: refused peers and closed connections only; "
                                 "debug: every connection too); stdout's JSON is not affected")
    .add(secret_file, "secret-file", "FILE holding the job's shared secret (at least 16 bytes, mode 600): every "
                                     "connection proves it before any other byte is read; members without it are refused")
    .add(tls_cert, "tls-cert", "PEM certificate of this process: TLS between all members, with --tls-key and --tls-ca "
                               "(value blocks then travel inside TLS: the plain-TCP data plane is off)")
    .add(tls_key, "tls-key", "PEM private key of --tls-cert")
    .add(tls_ca, "tls-ca", "PEM certificate of the authority that signed every member's certificate");
}

// The job: its app, cluster, model and schedule, consistency and compression.
void node_config::declare_training_options() {
  opt_group{custom_options_, "global"}
    .add(app, "app", "worker app: fmnist|kvcheck|bench")
    .add(cluster, "cluster", "embedded (one process) | processes (local cluster on loopback)")
    .add(servers, "servers", "number of server shards")
    .add(workers, "workers", "number of workers")
    .add(model, "model", "softmax|mlp")
    .add(epochs, "epochs", "passes over the training data")
    .add(lr, "lr", "learning rate of the server's update rule")
    .add(batch, "batch", "minibatch size per worker")
    .add(seed, "seed", "seed for initialization, shuffling and stragglers")
    .add(data, "data", "fmnist: directory of the Fashion-MNIST files (Debian's dataset-fashion-mnist)")
    .add(consistency, "consistency", "bsp|ssp|asp (default: bsp, or ssp when --staleness is given)")
    .add(staleness, "staleness", "SSP bound K: a read at clock c waits for min clock >= c - K (default: none, BSP)")
    .add(slow_worker, "slow-worker", "ID:FACTOR: that worker's compute always takes FACTOR times longer")
    .add(straggle, "straggle", "P:FACTOR: each iteration each worker is slowed by FACTOR with probability P")
    .add(pipeline, "pipeline", "on|off: overlap loading, pull prefetch and per-layer pushes with compute")
    .add(trace, "trace", "FILE: shards append a JSON line per push applied and pull answered")
    .add(target_accuracy, "target-accuracy", "bench_consistency: the accuracy seconds_to_target is timed to")
    .add(eval_every, "eval-every", "seconds between parameter snapshots for time-to-accuracy")
    .add(devices, "devices", "compute devices per worker (CPU threads; gradients reduced locally before one push)")
    .add(aggregation, "aggregation", "central|block|ring: how the devices' gradients are reduced")
    .add(compression, "compression", "none|fp16|int8|topk: codec of pushes on the wire")
    .add(topk_ratio, "topk-ratio", "fraction of values a topk push sends (error feedback keeps the rest)")
    .add(pull_compression, "pull-compression", "none|fp16|int8: codec of pull answers on the wire");
}

// What survives failures: checkpoints, chains, the coordinator's state, the disk tier,
// metrics, and the fault injector that tests it all.
void node_config::declare_durability_options() {
  opt_group{custom_options_, "global"}
    .add(checkpoint_dir, "checkpoint-dir", "DIR: the coordinator writes checkpoints here (periodic with --checkpoint-every or --checkpoint-seconds; psctl checkpoint asks for one)")
    .add(checkpoint_every, "checkpoint-every", "K: a checkpoint whenever the minimum clock crosses a multiple of K")
    .add(checkpoint_seconds, "checkpoint-seconds", "T: a checkpoint every T seconds, at the next clock boundary")
    .add(replication, "replication", "R: copies of each shard in a chain over consecutive servers (pushes to the head, "
                                     "pulls from the tail); a dead copy is spliced out, nothing lost")
    .add(restore, "restore", "DIR: the shards start from the newest intact checkpoint in DIR")
    .add(restore_non_finite, "restore-non-finite", "restore a checkpoint even if some of its values are NaN or Inf (refused otherwise)")
    .add(state_dir, "state-dir", "DIR: psnode's coordinator saves the job's state here (members, map, finished workers) "
                                 "so that it can be restarted with --resume")
    .add(resume, "resume", "the coordinator takes over the job saved in --state-dir (same address and flags): its "
                           "members rejoin within --ps.failure-timeout-ms")
    .add(on_sigterm, "on-sigterm", "stop|step-down: SIGTERM on psnode's coordinator stops the job (final checkpoint, "
                                   "exit 143) or, with --state-dir, steps down: it exits 143 at once, the job's state "
                                   "saved, and the members wait --ps.failure-timeout-ms for one started with --resume "
                                   "(a rescheduled pod; docs/clusters.md)")
    .add(shard_memory, "shard-memory", "BYTES: a shard's sparse-table rows in RAM; the rest on disk (0: all in RAM)")
    .add(shard_dir, "shard-dir", "DIR: where shards keep their disk tier (a disk; direct I/O; removed at exit)")
    .add(disk_readers, "disk-readers", "N: threads reading each shard's disk tier, so N random reads are in flight at "
                                       "once (a device serves many far faster than one at a time)")
    .add(eviction, "eviction", "lru|slru: which rows leave a shard's RAM first (slru: rows used twice are kept "
                               "through a scan)")
    .add(handoff, "handoff", "copy-ahead|cut: how a shard with a disk tier hands rows over when the map changes "
                             "(copy-ahead: sent while it serves on, the cut sends those changed since; cut: all at the cut)")
    .add(metrics, "metrics", "FILE: JSON lines of the job's progress (per epoch and every --ps.metrics-ms: loss, accuracy or "
                             "AUC, samples/s, workers' clocks, per-shard keys, bytes and request rates; ./run plot FILE draws them); "
                             "written by the launcher or psnode's coordinator")
    .add(health_port, "health-port", "P: every role serves http://HOST:P/healthz (200 while it runs) and /readyz (200 "
                                     "once ready: listening, serving, registered; 404 before) for a scheduler's probes "
                                     "(0: off; deploy/kubernetes/)")
    .add(metrics_port, "metrics-port", "P: serve the --metrics figures in Prometheus' text format at "
                                       "http://HOST:P/metrics (0: off); by the launcher or psnode's coordinator")
    .add(faults, "faults", "fault injector, ';'-separated: kill server=I at=C|handoff; kill worker=I at=C; "
                           "slow worker=I factor=F (see docs/checkpoints-and-faults.md)");
}

// [ps]: tuning, timeouts and the partitioning (--ps.NAME).
void node_config::declare_tuning_options() {
  opt_group{custom_options_, "ps"}
    .add(rule, "rule", "server update rule: sum|sgd|adagrad|adam, or one the app registered (default: the app's)")
    .add(rule_params, "rule-params", "the update rule's own hyper-parameters, NAME=VALUE,... (a rule an app "
                                     "registered with hyper-parameters, e.g. alpha=0.1,l1=1; the rest at its defaults)")
    .add(momentum, "momentum", "sgd momentum")
    .add(chunk_bytes, "chunk-bytes", "largest value payload per message")
    .add(push_chunk_bytes, "push-chunk-bytes", "largest value payload per push message (the smaller of this and "
                                               "--ps.chunk-bytes): shards sum a push chunk by chunk as it arrives")
    .add(inflight_bytes, "inflight-bytes", "bytes in flight per shard before chunks queue in the client")
    .add(crowded_inflight_bytes, "crowded-inflight-bytes",
         "the smaller budget that replaces --ps.inflight-bytes for shards reached over TCP while the worker and its "
         "peers on its host outnumber the host's CPUs (another request in flight then adds no overlap, only bytes "
         "for the caches)")
    .add(tcp_push_chunk_bytes, "tcp-push-chunk-bytes",
         "pushes are cut at the smaller of this and --ps.push-chunk-bytes while some shard is reached over TCP and "
         "the host is not crowded (a spare CPU sums one chunk at the shard while the next travels)")
    .add(metrics_ms, "metrics-ms", "interval of --metrics' progress lines")
    .add(transport, "transport", "how value blocks travel beside CAF: shm (TCP between hosts, shared-memory rings "
                                 "between processes on one host) or tcp (TCP only)")
    .add(data_plane_port, "data-plane-port", "port of the data connections' listener (0: any free port)")
    .add(data_plane_bytes, "data-plane-bytes", "value blocks of at least this many bytes travel over a plain TCP "
                                               "data connection beside CAF (0: all inside CAF messages)")
    .add(shm_ring_bytes, "shm-ring-bytes", "data connections between processes on one host move their payloads "
                                           "through a ring of this many bytes in shared memory each way (0: over TCP)")
    .add(shm_push_ring_bytes, "shm-push-ring-bytes", "size of the rings workers offer instead, which carry their "
                                                     "pushes: a shard sums each push chunk in place, holding its "
                                                     "room meanwhile, so the worker writes ahead into the rest")
    .add(direct_requests, "direct-requests", "1: workers send pushes, pulls and clock ticks to shards over the data "
                                             "connections, beside their payloads, instead of through CAF's broker "
                                             "(0: through CAF)")
    .add(caller_runs, "caller-runs", "1: the thread that calls push or pull runs the worker's client actor for the "
                                     "request when the actor is idle, and the requests it makes between two waits "
                                     "leave in one write (0: the scheduler's thread takes each)")
    .add(busy_poll_us, "busy-poll-us", "a data connection's reader polls its socket this many microseconds for the "
                                       "next frame (and a shared-memory ring's side for the other side) before it "
                                       "sleeps, while no other thread wants its vCPU and while its process and its "
                                       "peers on its host fit the host's CPUs (0: sleeps at once): waking a "
                                       "thread on an idle vCPU took about 50 us here, more than a small request's work")
    .add(tcp_congestion, "tcp-congestion", "TCP congestion control of this process's ends of data connections, "
                                           "set before each connects (Linux's TCP_CONGESTION; 'system': the host's "
                                           "default). cubic by default: BBR, where the host defaults to it, paces "
                                           "each connection with a kernel timer when no fq qdisc does, and moved "
                                           "less (BENCHMARKS.md, \"Data connections under cubic\")")
    .add(timeout_ms, "timeout-ms", "timeout of every push/pull request")
    .add(max_message_bytes, "max-message-bytes", "largest message a peer may announce; a larger one closes its "
                                                 "connection, naming the peer (handshakes: at most 64 KiB)")
    .add(heartbeat_ms, "heartbeat-ms", "interval of heartbeats between connected nodes (0: none); "
                                       "keep it above the slowest connection handshake (docs/wire-and-caf.md)")
    .add(failure_timeout_ms, "failure-timeout-ms", "a node silent (no message, no heartbeat) this long is declared dead")
    .add(retry_ms, "retry-ms", "send a request again when unanswered this long (default: 200 with --faults "
                               "drop/duplicate/delay, else never)")
    .add(register_timeout_ms, "register-timeout-ms", "how long members wait for the cluster to form")
    .add(barrier_timeout_ms, "barrier-timeout-ms", "how long a worker waits at a barrier")
    .add(wait_report_ms, "wait-report-ms", "while members are missing, the coordinator says every this many ms "
                                           "which it has and which it waits for (0: never)")
    .add(vnodes, "vnodes", "virtual nodes per shard on the hash ring")
    .add(bucket_bits, "bucket-bits", "log2 of keys per partitioning bucket")
    .add(reply_delay_ms, "reply-delay-ms", "test hook: servers answer this late");
}

namespace {

// CAF ignores unknown keys and wrongly typed values in INI files; we refuse them.
caf::error check_ini(const char* path, const caf::config_option_set& opts) {
  auto parsed = caf::actor_system_config::parse_config_file(path);
  if (!parsed)
    return parsed.error();
  auto check = [&](const std::string& category, const std::string& key,
                   const caf::config_value& val) -> caf::error {
    auto opt = opts.qualified_name_lookup(category, key);
    if (!opt)
      return make_ps_error(std::string(path) + ": unknown option " + category + "." + key);
    if (auto err = opt->check(val))
      return make_ps_error(std::string(path) + ": " + category + "." + key + " = " +
                           caf::to_string(val) + " is not a valid " +
                           std::string(opt->type_name().data(), opt->type_name().size()));
    return {};
  };
  for (const auto& [name, value] : *parsed) {
    const auto* group = caf::get_if<caf::config_value::dictionary>(&value);
    if (!group) {  // CAF keeps [global] keys at the top level
      if (auto err = check("global", name, value)) return err;
      continue;
    }
    for (const auto& [key, val] : *group)
      if (auto err = check(name, key, val)) return err;
  }
  return {};
}

}  // namespace

namespace {

// "--ps.vnodes=4" -> "ps.vnodes", "--global.model=x" -> "model"; "" for what is no option.
std::string option_name(const std::string& arg) {
  if (arg.rfind("--", 0) != 0) return {};
  auto name = arg.substr(2, arg.find('=') - 2);
  if (name.rfind("global.", 0) == 0) name = name.substr(7);
  return name;
}

// The options an INI file sets, named as on the command line.
void add_ini_options(const std::string& path, std::set<std::string>& out) {
  auto parsed = caf::actor_system_config::parse_config_file(path.c_str());
  if (!parsed) return;  // check_ini has reported it
  for (const auto& [name, value] : *parsed) {
    const auto* group = caf::get_if<caf::config_value::dictionary>(&value);
    if (!group) {
      out.insert(name);
      continue;
    }
    for (const auto& entry : *group) out.insert(name == "global" ? entry.first : name + "." + entry.first);
  }
}

}  // namespace

bool node_config::parse_args(int argc, char** argv) {
  try {
    for (const auto& flag : registered_app_flags()) declare(flag);
  } catch (const bad_request& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return false;
  }
  args.assign(argv + 1, argv + argc);
  if (!help.name.empty())
    for (const auto& a : args)
      if (a == "--help" || a == "-h" || a == "-?") {  // this program's flags, not every option
        std::printf("%s", help_text().c_str());
        cli_helptext_printed = true;
        return false;
      }
  for (const auto& a : args)
    if (auto name = option_name(a); !name.empty()) given.insert(name);
  std::string ini = "caf-application.ini";
  bool explicit_ini = false;
  for (const auto& a : args)
    if (a.rfind("--config-file=", 0) == 0) {
      ini = a.substr(14);
      explicit_ini = true;
    }
  if (explicit_ini || std::filesystem::exists(ini)) {
    if (auto err = check_ini(ini.c_str(), custom_options_)) {
      std::fprintf(stderr, "error: %s\n", describe(err).c_str());
      return false;
    }
    add_ini_options(ini, given);
  }
  // --dump-config is ours: the effective values after every check, not CAF's defaults.
  std::vector<char*> caf_argv{argv[0]};
  bool dump = false;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--dump-config") dump = true;
    else caf_argv.push_back(argv[i]);
  if (auto err = parse(static_cast<int>(caf_argv.size()), caf_argv.data())) {
    std::fprintf(stderr, "error: %s\n", explain_parse_error(err).c_str());
    return false;
  }
  if (cli_helptext_printed)
    return false;
  try {
    apply_layout(*this);  // the role and the job's size from a launcher's rank, before they are checked
    validate();
    if (dump) {
      std::printf("%s", effective_config().c_str());
      cli_helptext_printed = true;
      return false;
    }
  } catch (const bad_request& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return false;
  }
  return true;
}

void node_config::declare(const app_flag& flag) {
  if (declared(flag.name)) return;  // declared by an earlier parse_args
  if (custom_options_.qualified_name_lookup("global", flag.name))
    throw bad_request("an app declares flag --" + flag.name + ", which is a built-in option");
  opt_group global{custom_options_, "global"};
  switch (flag.kind) {
    case app_flag_kind::count: global.add(app_count_values_[flag.name], flag.name, flag.help); break;
    case app_flag_kind::number: global.add(app_number_values_[flag.name], flag.name, flag.help); break;
    case app_flag_kind::counts: global.add(app_counts_values_[flag.name], flag.name, flag.help); break;
    case app_flag_kind::text: global.add(app_text_values_[flag.name], flag.name, flag.help); break;
  }
  set_app_flag(flag.name, flag.fallback);
}

namespace {

template <class Map>
auto& app_value(Map& values, const std::string& name, const char* kind) {
  auto it = values.find(name);
  if (it == values.end()) throw bad_request("no registered app declares " + std::string(kind) + " flag --" + name);
  return it->second;
}

}  // namespace

std::size_t node_config::app_count(const std::string& name) const {
  return app_value(app_count_values_, name, "a count");
}
double node_config::app_number(const std::string& name) const { return app_value(app_number_values_, name, "a number"); }
const std::vector<std::int64_t>& node_config::app_counts(const std::string& name) const {
  return app_value(app_counts_values_, name, "a list");
}
const std::string& node_config::app_text(const std::string& name) const {
  return app_value(app_text_values_, name, "a text");
}

bool node_config::declared(const std::string& name) const {
  return app_count_values_.count(name) + app_number_values_.count(name) + app_counts_values_.count(name) +
           app_text_values_.count(name) > 0;
}

std::string node_config::app_flag_text(const std::string& name) const {
  if (auto it = app_count_values_.find(name); it != app_count_values_.end()) return setting_text(std::uint64_t{it->second});
  if (auto it = app_number_values_.find(name); it != app_number_values_.end()) return setting_text(it->second);
  if (auto it = app_text_values_.find(name); it != app_text_values_.end()) return it->second;
  return setting_text(app_value(app_counts_values_, name, "a"));
}

void node_config::set_app_flag(const std::string& name, const std::string& text) {
  auto bad = [&] { return bad_request("--" + name + "=" + text + " is not a valid value"); };
  if (auto it = app_count_values_.find(name); it != app_count_values_.end()) {
    auto v = parse_count(text);
    if (!v) throw bad();
    it->second = static_cast<std::size_t>(*v);
  } else if (auto it = app_number_values_.find(name); it != app_number_values_.end()) {
    auto v = parse_number(text);
    if (!v) throw bad();
    it->second = *v;
  } else if (auto it = app_text_values_.find(name); it != app_text_values_.end()) {
    it->second = text;
  } else {
    auto v = parse_counts(text);
    if (!v) throw bad();
    app_value(app_counts_values_, name, "a") = std::move(*v);
  }
}

std::string node_config::explain_parse_error(const caf::error& err) const {
  // CAF renders a bad value as parser_error(<code>, ({"argument" = "--lr=nan"})).
  auto text = render(err);
  const std::string mark = "\"argument\" = \"";
  auto at = text.find(mark);
  if (at == std::string::npos) return text;
  auto argument = text.substr(at + mark.size(), text.find('"', at + mark.size()) - at - mark.size());
  auto eq = argument.find('=');
  if (argument.rfind("--", 0) != 0 || eq == std::string::npos) return "cannot read argument " + argument;
  auto name = argument.substr(2, eq - 2);
  auto dot = name.find('.');
  auto* option = custom_options_.qualified_name_lookup(dot == std::string::npos ? "global" : name.substr(0, dot),
                                                       dot == std::string::npos ? name : name.substr(dot + 1));
  if (!option) return "unknown option --" + name;
  const auto type_view = option->type_name(), help_view = option->description();
  const std::string type(type_view.begin(), type_view.end()), help(help_view.begin(), help_view.end());
  std::string wanted = type == "real64"                       ? "a finite number"
                       : type == "int64"                      ? "a whole number"
                       : type.rfind("uint", 0) == 0           ? "a whole number >= 0"
                       : type.rfind("list of", 0) == 0        ? "a list such as [1,2]"
                       : type == "string"                     ? "a text"
                                                              : type;
  return argument + ": \"" + argument.substr(eq + 1) + "\" is not " + wanted + " (--" + name + ": " +
         help + ")";
}

}  // namespace ps
