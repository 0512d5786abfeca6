// node_config: flags and INI files, their checks, and the actor options they give.
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
#include "libps/row_disk.hpp"
#include "libps/row_tier.hpp"
#include "libps/log.hpp"
#include "libps/secret.hpp"
#include "libps/tcp_congestion.hpp"
#include "runtime/tls_stream.hpp"
#include "libps/text.hpp"
#include "runtime/app_registry.hpp"
#include "runtime/job_contract.hpp"

namespace ps {

using std::chrono::milliseconds;

// ---- configuration ------------------------------------------------------------------

node_config::node_config() {
  register_types(*this);
  load<caf::io::middleman>();
  opt_group{custom_options_, "global"}
    .add(role, "role", "psnode role: coordinator|server|worker|local|export (local: the whole job of --app here; "
                       "export: --checkpoint-dir's newest checkpoint as .npy files in --out)")
    .add(out, "out", "export: DIR the .npy files and manifest.json go to")
    .add(coordinator, "coordinator", "coordinator address HOST:PORT")
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
    .add(tls_ca, "tls-ca", "PEM certificate of the authority that signed every member's certificate")
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
    .add(pull_compression, "pull-compression", "none|fp16|int8: codec of pull answers on the wire")
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
    .add(metrics_port, "metrics-port", "P: serve the --metrics figures in Prometheus' text format at "
                                       "http://HOST:P/metrics (0: off); by the launcher or psnode's coordinator")
    .add(faults, "faults", "fault injector, ';'-separated: kill server=I at=C|handoff; kill worker=I at=C; "
                           "slow worker=I factor=F (see docs/checkpoints-and-faults.md)");
  declare_tuning_options();
}

// [ps]: tuning, timeouts and the partitioning (--ps.NAME).
void node_config::declare_tuning_options() {
  opt_group{custom_options_, "ps"}
    .add(rule, "rule", "server update rule: sum|sgd|adagrad|adam (default: the app's)")
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

void node_config::validate() const {
  auto one_of = [](const std::string& name, const std::string& v, std::vector<std::string> ok) {
    for (const auto& o : ok)
      if (v == o) return;
    std::string list;
    for (const auto& o : ok) list += (list.empty() ? "" : "|") + o;
    throw bad_request("--" + name + "=" + v + " is not one of " + list);
  };
  if (!role.empty()) one_of("role", role, {"coordinator", "server", "worker", "local", "export"});
  if (role == "export" && (checkpoint_dir.empty() || out.empty()))
    throw bad_request("--role=export needs --checkpoint-dir=DIR (where the checkpoints are) and --out=DIR");
  one_of("cluster", cluster, {"embedded", "processes"});
  one_of("model", model, {"softmax", "mlp"});
  if (!rule.empty()) rule_handle{rule};  // throws naming the known rules
  if (servers < 1 || servers > 1024) throw bad_request("--servers must be in [1, 1024]");
  if (workers < 1 || workers > 1024) throw bad_request("--workers must be in [1, 1024]");
  if (epochs < 1) throw bad_request("--epochs must be >= 1");
  if (batch < 1) throw bad_request("--batch must be >= 1");
  if (!(lr > 0)) throw bad_request("--lr must be > 0");
  validate_wire();
  for (const auto& flag : registered_app_flags())
    if (flag.check && declared(flag.name))
      if (auto wrong = flag.check(*this); !wrong.empty()) throw bad_request("--" + flag.name + ": " + wrong);
  eviction_policy_of(eviction);
  if (handoff != "copy-ahead" && handoff != "cut")
    throw bad_request("--handoff=" + handoff + ": must be copy-ahead or cut");
  if (disk_readers < 1 || disk_readers > 256) throw bad_request("--disk-readers=" + std::to_string(disk_readers) + ": must be 1 to 256");
  if (shard_memory > 0 && shard_memory < min_tier_budget) throw bad_request("--shard-memory must be 0 or at least 1 MiB");
  if (shard_memory > 0 && (role.empty() || role == "server" || role == "local"))
    if (auto why = direct_io_problem(shard_dir); !why.empty()) throw bad_request("--shard-dir: " + why);
  if (!coordinator.empty()) parse_host_port(coordinator);
  validate_metrics();
  resolve_endpoint({host, port, listen, advertise});
  if (given.count("staleness") && staleness < 0)
    throw bad_request("--staleness=" + std::to_string(staleness) + " must be >= 0 (0: BSP; K: a read waits for "
                      "every worker to be within K clocks)");
  staleness_bound("bsp");
  push_codec();
  pull_codec();
  validate_checkpoints();
  validate_security();
  if (devices < 1 || devices > 64) throw bad_request("--devices must be in [1, 64]");
  if (replication < 1 || replication > servers)
    throw bad_request("--replication=" + std::to_string(replication) + " must be in [1, --servers=" +
                      std::to_string(servers) + "] (each copy of a shard lives on another server)");
  auto plan = fault_spec();
  if (!plan.kills.empty() && cluster == "embedded" && (role.empty() || role == "local"))
    throw bad_request("--faults: kill needs --cluster=processes (a kill ends the whole process)");
  if (heartbeat_ms > 0 && failure_timeout_ms < 2 * heartbeat_ms)
    throw bad_request("--ps.failure-timeout-ms must be at least twice --ps.heartbeat-ms (a late heartbeat is not a failure)");
  if (retry_ms < -1 || retry_ms == 0 || retry_ms > static_cast<std::int64_t>(timeout_ms))
    throw bad_request("--ps.retry-ms must be in [1, --ps.timeout-ms]");

  one_of("aggregation", aggregation, {"central", "block", "ring"});
  one_of("pipeline", pipeline, {"on", "off"});
  auto slow = parse_slow_worker(slow_worker);
  if (slow.set && slow.worker >= workers)
    throw bad_request("--slow-worker=" + slow_worker + ": there are only " + std::to_string(workers) +
                      " workers (ids 0.." + std::to_string(workers - 1) + ")");
  parse_straggle(straggle);
  if (!(target_accuracy > 0 && target_accuracy <= 1)) throw bad_request("--target-accuracy must be in (0, 1]");
  if (!(eval_every > 0)) throw bad_request("--eval-every must be > 0");
}

// The [ps] tuning of messages and data connections.
void node_config::validate_wire() const {
  if (chunk_bytes < 1024 || chunk_bytes > (256u << 20))
    throw bad_request("--ps.chunk-bytes must be in [1 KiB, 256 MiB]");
  if (push_chunk_bytes < 1024 || push_chunk_bytes > (256u << 20))
    throw bad_request("--ps.push-chunk-bytes must be in [1 KiB, 256 MiB]");
  if (shm_ring_bytes != 0 && (shm_ring_bytes < (64u << 10) || shm_ring_bytes > (1u << 30)))
    throw bad_request("--ps.shm-ring-bytes must be 0 (no rings) or in [64 KiB, 1 GiB]");
  if (shm_push_ring_bytes < (64u << 10) || shm_push_ring_bytes > (1u << 30))
    throw bad_request("--ps.shm-push-ring-bytes must be in [64 KiB, 1 GiB]");
  if (inflight_bytes < 1) throw bad_request("--ps.inflight-bytes must be >= 1");
  if (crowded_inflight_bytes < 1) throw bad_request("--ps.crowded-inflight-bytes must be >= 1");
  if (tcp_push_chunk_bytes < 1024 || tcp_push_chunk_bytes > (256u << 20))
    throw bad_request("--ps.tcp-push-chunk-bytes must be in [1 KiB, 256 MiB]");
  if (busy_poll_us > 100000) throw bad_request("--ps.busy-poll-us must be <= 100000 (0.1 s)");
  // A name given is checked here; the default, where a kernel lacks it, leaves data
  // connections on the host's default with the data plane's warning instead of refusing to run.
  if (tcp_congestion != default_tcp_congestion)
    if (auto why = check_tcp_congestion(tcp_congestion); !why.empty()) throw bad_request("--ps.tcp-congestion: " + why);
  if (timeout_ms < 1) throw bad_request("--ps.timeout-ms must be >= 1");
  if (bucket_bits > 40) throw bad_request("--ps.bucket-bits must be <= 40");
  if (vnodes < 1 || vnodes > 65536) throw bad_request("--ps.vnodes must be in [1, 65536]");
}

// --metrics, --metrics-port: written or served by the job's observer, never by a member.
void node_config::validate_metrics() const {
  if (metrics_ms < 100) throw bad_request("--ps.metrics-ms must be >= 100");
  const bool member = role == "server" || role == "worker";
  if (!metrics.empty()) {
    if (member)
      throw bad_request("--metrics: the job's metrics are written by its coordinator (give --metrics=FILE there)");
    auto dir = std::filesystem::path(metrics).parent_path();
    if (::access(dir.empty() ? "." : dir.c_str(), W_OK) != 0)
      throw bad_request("--metrics=" + metrics + ": cannot write there: " + std::strerror(errno));
  }
  if (metrics_port != 0 && member)
    throw bad_request("--metrics-port: the job's metrics are served by its coordinator (give --metrics-port=P there)");
}

// --secret-file, --tls-*, --ps.max-message-bytes: refused at start-up, not at the first connection.
void node_config::validate_security() const {
  if (!parse_log_level(log_level)) throw bad_request("--log-level=" + log_level + " is not one of error|warning|info|debug");
  if (!secret_file.empty()) read_secret_file(secret_file);  // throws naming the file
  const bool any_tls = !tls_cert.empty() || !tls_key.empty() || !tls_ca.empty();
  if (any_tls && (tls_cert.empty() || tls_key.empty() || tls_ca.empty()))
    throw bad_request("TLS needs all three of --tls-cert, --tls-key and --tls-ca");
  if (any_tls) tls_context check(tls_cert, tls_key, tls_ca);  // throws naming the file that cannot be used
  if (max_message_bytes < chunk_bytes + (1u << 20) || max_message_bytes > 0xFFFFFFFFull)
    throw bad_request("--ps.max-message-bytes must be in [--ps.chunk-bytes + 1 MiB, 4 GiB) (a chunk and its headers "
                      "must fit; CAF cannot announce 4 GiB)");
  if (direct_requests > 1) throw bad_request("--ps.direct-requests=" + std::to_string(direct_requests) + ": 1 or 0");
  if (caller_runs > 1) throw bad_request("--ps.caller-runs=" + std::to_string(caller_runs) + ": 1 or 0");
}

// Where checkpoints go and come from, and how often.
void node_config::validate_checkpoints() const {
  if (!(checkpoint_seconds >= 0) || checkpoint_seconds > 1e6)
    throw bad_request("--checkpoint-seconds must be in [0, 1e6]");
  // Only whoever writes the files needs the directory: a server or worker adopts the job's
  // --checkpoint-every from the coordinator, which has the directory.
  const bool writes_checkpoints = role.empty() || role == "coordinator" || role == "local";
  if (!checkpoint_dir.empty() && writes_checkpoints)
    if (auto why = unwritable_directory(checkpoint_dir); !why.empty()) throw bad_request("--checkpoint-dir: " + why);
  if (writes_checkpoints && (checkpoint_every > 0 || checkpoint_seconds > 0) && checkpoint_dir.empty())
    throw bad_request(std::string(checkpoint_every > 0 ? "--checkpoint-every" : "--checkpoint-seconds") +
                      " needs --checkpoint-dir=DIR");
  if (!restore.empty() && !std::filesystem::is_directory(restore))
    throw bad_request("--restore=" + restore + ": no such directory");
  validate_state_dir();
}

// A coordinator that can be restarted (--state-dir, --resume).
void node_config::validate_state_dir() const {
  if (resume && state_dir.empty()) throw bad_request("--resume needs --state-dir=DIR (where the coordinator saved the job)");
  if (state_dir.empty()) return;
  if (role != "coordinator")
    throw bad_request("--state-dir is for psnode --role=coordinator (a launcher's coordinator ends with its job)");
  if (auto why = unwritable_directory(state_dir); !why.empty()) throw bad_request("--state-dir: " + why);
}

fault_plan node_config::fault_spec() const {
  auto plan = parse_faults(faults);
  plan.check_against(servers, workers);
  return plan;
}

namespace {

// parse_codec, with the flag named in its error.
codec codec_flag(const std::string& flag, const std::string& value) {
  try {
    return parse_codec(value);
  } catch (const bad_request& e) {
    throw bad_request("--" + flag + "=" + value + ": " + e.what());
  }
}

}  // namespace

codec node_config::push_codec() const {
  codec c = codec_flag("compression", compression);
  if (c.kind == codec_kind::topk) c.topk_ratio = topk_ratio;
  if (!(topk_ratio > 0 && topk_ratio <= 1))
    throw bad_request("--topk-ratio=" + std::to_string(topk_ratio) + " is not in (0, 1]");
  return c;
}

codec node_config::pull_codec() const {
  codec c = codec_flag("pull-compression", pull_compression);
  if (c.kind == codec_kind::topk)
    throw bad_request("--pull-compression=" + pull_compression +
                      ": pulls take none, fp16 or int8 (top-k would drop most parameters)");
  return c;
}

std::uint64_t node_config::staleness_bound(const std::string& app_default) const {
  return staleness_from(consistency.empty() && staleness < 0 ? app_default : consistency, staleness);
}

namespace {

// A number filling all of `text`; throws bad_request naming the flag.
double parse_number(const std::string& flag, const std::string& whole, const std::string& text) {
  auto v = ps::parse_number(text);
  if (!v) throw bad_request("--" + flag + "=" + whole + ": \"" + text + "\" is not a number");
  return *v;
}

std::pair<std::string, std::string> split_colon(const std::string& flag, const std::string& s,
                                                const char* form) {
  auto colon = s.find(':');
  if (colon == std::string::npos)
    throw bad_request("--" + flag + "=" + s + " is not " + form);
  return {s.substr(0, colon), s.substr(colon + 1)};
}

}  // namespace

slow_worker_spec parse_slow_worker(const std::string& s) {
  if (s.empty()) return {};
  auto [id, factor] = split_colon("slow-worker", s, "ID:FACTOR");
  auto w = parse_number("slow-worker", s, id);
  auto f = parse_number("slow-worker", s, factor);
  if (w < 0 || w != std::floor(w)) throw bad_request("--slow-worker=" + s + ": worker id must be a whole number >= 0");
  if (f < 1) throw bad_request("--slow-worker=" + s + ": FACTOR must be >= 1");
  return {true, static_cast<std::uint32_t>(w), f};
}

straggle_spec parse_straggle(const std::string& s) {
  if (s.empty()) return {};
  auto [p, factor] = split_colon("straggle", s, "P:FACTOR");
  auto pv = parse_number("straggle", s, p);
  auto f = parse_number("straggle", s, factor);
  if (pv < 0 || pv > 1) throw bad_request("--straggle=" + s + ": P must be in [0, 1]");
  if (f < 1) throw bad_request("--straggle=" + s + ": FACTOR must be >= 1");
  return {pv, f};
}

void apply_runtime_defaults(node_config& cfg) {
  // With two processes per core pair, work sharing beat work stealing 1.5x across
  // processes (docs/wire-and-caf.md, "CAF 0.17 facts"); bench_kv re-measures it
  // (docs/wire-and-caf.md, "Scheduler").
  if (!caf::get_if<caf::atom_value>(&cfg, "scheduler.policy"))
    cfg.set("scheduler.policy", caf::atom("sharing"));
  // A server's or worker's actors only move messages (blocking work has threads of its
  // own: the data plane, disk I/O, the app), and waking another scheduler thread is a
  // futex round trip: with one, 4 KiB requests at window 8 moved 1.4-1.7x as many per
  // second and fmnist trained 20% faster on 2 cores (BENCHMARKS.md).
  if ((cfg.role == "server" || cfg.role == "worker") &&
      !caf::get_if<caf::config_value::integer>(&cfg, "scheduler.max-threads"))
    cfg.set("scheduler.max-threads", caf::config_value::integer{1});
  // Failure detection of hung or cut-off peers (a killed one is noticed at once anyway):
  // heartbeats, and a deadline for silence. Explicit middleman.* settings win.
  if (cfg.heartbeat_ms > 0 && !caf::get_if<caf::timespan>(&cfg, "middleman.heartbeat-interval")) {
    cfg.set("middleman.heartbeat-interval", caf::timespan{milliseconds(cfg.heartbeat_ms)});
    cfg.set("middleman.connection-timeout", caf::timespan{milliseconds(cfg.failure_timeout_ms)});
  }
  // Value blocks of MiBs come and go many times a second. glibc would map each afresh
  // and fault its pages in (then zero them); from the heap, freed blocks are reused.
  // Costs: up to 1 GiB freed memory kept before it is given back. (bench_kv;
  // docs/wire-and-caf.md, "Memory and the allocator")
  // For builds on glibc's malloc (-DPS_JEMALLOC=OFF, sanitizers); jemalloc, which the
  // programs link, keeps freed extents for reuse by itself and ignores this.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (auto level = parse_log_level(cfg.log_level)) set_log_level(*level);
  // CAF's logger is compiled out of Debian's CAF: its flags would do nothing, silently.
  for (const char* caf_flag : {"logger.verbosity", "logger.console-verbosity", "logger.file-verbosity"})
    if (caf::get_if<caf::atom_value>(&cfg, caf::string_view(caf_flag, std::strlen(caf_flag))))
      log_line(log_level::warning, std::string("--") + caf_flag + " does nothing: CAF's logger is compiled out of " +
                                       "Debian's CAF; --log-level sets what ActorPS says");
  // The data plane is plain TCP: under TLS every value block travels in CAF's messages.
  if (!cfg.tls_cert.empty()) cfg.data_plane_bytes = 0;
}

update_rule rule_from(const node_config& cfg, const std::string& default_rule) {
  update_rule r;
  r.kind = cfg.rule.empty() ? default_rule : cfg.rule;
  r.lr = static_cast<float>(cfg.lr);
  r.momentum = static_cast<float>(cfg.momentum);
  r.validate();
  return r;
}

job_settings settings_from(const node_config& cfg, const std::string& default_rule,
                           const std::string& default_consistency) {
  return {rule_from(cfg, default_rule), cfg.staleness_bound(default_consistency), {},
          static_cast<std::uint32_t>(cfg.bucket_bits)};
}

coordinator_options coordinator_options_from(const node_config& cfg, const job_settings& settings) {
  coordinator_options o;
  o.servers = static_cast<std::uint32_t>(cfg.servers);
  o.workers = static_cast<std::uint32_t>(cfg.workers);
  o.vnodes = static_cast<std::uint32_t>(cfg.vnodes);
  o.bucket_bits = settings.bucket_bits;
  o.rule = settings.rule;
  o.staleness = settings.staleness;
  o.checkpoint_every = cfg.checkpoint_every;
  o.checkpoint_seconds = cfg.checkpoint_seconds;
  o.checkpoint_dir = cfg.checkpoint_dir;
  o.wait_report = milliseconds(cfg.wait_report_ms);
  o.replication = static_cast<std::uint32_t>(cfg.replication);
  o.spec = settings.spec;
  o.tables = settings.tables;
  o.replacement = shard_options_from(cfg, "");
  o.replacement.faults = {};  // a kill names the original shard's process, not its replacement
  return o;
}

shard_options shard_options_from(const node_config& cfg, std::string host) {
  shard_options o;
  o.host = std::move(host);
  o.register_timeout = milliseconds(cfg.register_timeout_ms);
  o.reply_delay = milliseconds(cfg.reply_delay_ms);
  // A parked pull must fail with its reason before the client gives up on it.
  o.park_limit = milliseconds(std::max<std::size_t>(1, cfg.timeout_ms * 9 / 10));
  o.trace_path = cfg.trace;
  o.shard_memory = cfg.shard_memory;
  o.shard_dir = cfg.shard_dir;
  o.disk_io.readers = cfg.disk_readers;
  o.eviction = eviction_policy_of(cfg.eviction);
  o.copy_ahead = cfg.handoff == "copy-ahead";
  o.faults = cfg.fault_spec();
  o.forward_timeout = milliseconds(cfg.timeout_ms);
  o.given = given_settings(cfg);
  return o;
}

}  // namespace ps

namespace ps {

namespace {

// The local address of this host's route to host:port: a UDP socket "connected" there
// (nothing is sent) is bound by the kernel to the interface that reaches it.
std::string local_address_toward(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    throw bad_request("--coordinator: cannot resolve \"" + host + "\": " + gai_strerror(rc));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, freeaddrinfo);
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw bad_request(std::string("socket: ") + std::strerror(errno));
  sockaddr_in local{};
  socklen_t len = sizeof local;
  bool ok = ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  auto err = errno;
  ::close(fd);
  if (!ok)
    throw bad_request("no route to the coordinator at " + host + ":" + std::to_string(port) + ": " +
                      std::strerror(err) + " (give --advertise=HOST)");
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return text;
}

}  // namespace

std::size_t node_config::offered_ring_bytes() const {
  if (shm_ring_bytes == 0) return 0;
  return role == "worker" ? shm_push_ring_bytes : shm_ring_bytes;
}

endpoint node_config::endpoint_of() const {
  auto e = resolve_endpoint({host, port, listen, advertise});
  if (e.advertise_host.empty() && !coordinator.empty()) {
    auto [coord_host, coord_port] = parse_host_port(coordinator);
    e.advertise_host = local_address_toward(coord_host, coord_port);
  }
  if (e.advertise_host.empty()) e.advertise_host = e.every_interface() ? "127.0.0.1" : e.bind_host;
  return e;
}

}  // namespace ps
