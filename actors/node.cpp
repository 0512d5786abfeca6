#include "actors/node.hpp"

#include <caf/io/all.hpp>

#include <malloc.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "actors/checkpointer.hpp"
#include "actors/server_shard.hpp"
#include "libps/text.hpp"
#include "runtime/job_contract.hpp"
#include "runtime/signals.hpp"

#include <nlohmann/json.hpp>

extern char** environ;

namespace ps {

using std::chrono::milliseconds;

// ---- configuration ------------------------------------------------------------------

node_config::node_config() {
  register_types(*this);
  load<caf::io::middleman>();
  opt_group{custom_options_, "global"}
    .add(role, "role", "psnode role: coordinator|server|worker|local (local: the whole job of --app here)")
    .add(coordinator, "coordinator", "coordinator address HOST:PORT")
    .add(host, "host", "address this node listens on and announces")
    .add(port, "port", "coordinator: port to listen on (0: any free port)")
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
    .add(staleness, "staleness", "SSP bound: a read at clock c waits for min clock >= c - K")
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
    .add(checkpoint_dir, "checkpoint-dir", "DIR: the coordinator writes checkpoints here")
    .add(checkpoint_every, "checkpoint-every", "K: a checkpoint whenever the minimum clock crosses a multiple of K")
    .add(checkpoint_seconds, "checkpoint-seconds", "T: a checkpoint every T seconds, at the next clock boundary")
    .add(replication, "replication", "R: copies of each shard in a chain over consecutive servers (pushes to the head, "
                                     "pulls from the tail); a dead copy is spliced out, nothing lost")
    .add(restore, "restore", "DIR: the shards start from the newest intact checkpoint in DIR")
    .add(faults, "faults", "fault injector, ';'-separated: kill server=I at=C; kill worker=I at=C; "
                           "slow worker=I factor=F (see README)")
    .add(clocks, "clocks", "clocksum: iterations (clock ticks) per worker")
    .add(clock_ms, "clock-ms", "clocksum: simulated compute per clock, in ms")
    .add(sizes, "sizes", "bench_kv: value sizes in bytes, e.g. [4096,1048576]")
    .add(windows, "windows", "bench_kv: requests in flight, e.g. [1,8]")
    .add(cell_seconds, "cell-seconds", "bench_kv: seconds per measured cell");
  opt_group{custom_options_, "ps"}
    .add(rule, "rule", "server update rule: sum|sgd|adagrad|adam (default: the app's)")
    .add(momentum, "momentum", "sgd momentum")
    .add(chunk_bytes, "chunk-bytes", "largest value payload per message")
    .add(inflight_bytes, "inflight-bytes", "bytes in flight per shard before chunks queue in the client")
    .add(data_plane_bytes, "data-plane-bytes", "value blocks of at least this many bytes travel over a plain TCP "
                                               "data connection beside CAF (0: all inside CAF messages)")
    .add(timeout_ms, "timeout-ms", "timeout of every push/pull request")
    .add(heartbeat_ms, "heartbeat-ms", "interval of heartbeats between connected nodes (0: none); "
                                       "keep it above the slowest connection handshake (CAF-NOTES 4)")
    .add(failure_timeout_ms, "failure-timeout-ms", "a node silent (no message, no heartbeat) this long is declared dead")
    .add(retry_ms, "retry-ms", "send a request again when unanswered this long (default: 200 with --faults "
                               "drop/duplicate/delay, else never)")
    .add(register_timeout_ms, "register-timeout-ms", "how long members wait for the cluster to form")
    .add(barrier_timeout_ms, "barrier-timeout-ms", "how long a worker waits at a barrier")
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
  args.assign(argv + 1, argv + argc);
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
  if (auto err = parse(argc, argv)) {
    std::fprintf(stderr, "error: %s\n", render(err).c_str());
    return false;
  }
  if (cli_helptext_printed)
    return false;
  try {
    validate();
  } catch (const bad_request& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return false;
  }
  return true;
}

void node_config::validate() const {
  auto one_of = [](const std::string& name, const std::string& v, std::vector<std::string> ok) {
    for (const auto& o : ok)
      if (v == o) return;
    std::string list;
    for (const auto& o : ok) list += (list.empty() ? "" : "|") + o;
    throw bad_request("--" + name + "=" + v + " is not one of " + list);
  };
  if (!role.empty()) one_of("role", role, {"coordinator", "server", "worker", "local"});
  one_of("cluster", cluster, {"embedded", "processes"});
  one_of("model", model, {"softmax", "mlp"});
  if (!rule.empty()) update_rule::parse_kind(rule);
  if (servers < 1 || servers > 1024) throw bad_request("--servers must be in [1, 1024]");
  if (workers < 1 || workers > 1024) throw bad_request("--workers must be in [1, 1024]");
  if (epochs < 1) throw bad_request("--epochs must be >= 1");
  if (batch < 1) throw bad_request("--batch must be >= 1");
  if (!(lr > 0)) throw bad_request("--lr must be > 0");
  if (chunk_bytes < 1024 || chunk_bytes > (256u << 20))
    throw bad_request("--ps.chunk-bytes must be in [1 KiB, 256 MiB]");
  if (inflight_bytes < 1) throw bad_request("--ps.inflight-bytes must be >= 1");
  if (timeout_ms < 1) throw bad_request("--ps.timeout-ms must be >= 1");
  if (bucket_bits > 40) throw bad_request("--ps.bucket-bits must be <= 40");
  if (vnodes < 1 || vnodes > 65536) throw bad_request("--ps.vnodes must be in [1, 65536]");
  for (auto s : sizes)
    if (s < 4 || s % 4 != 0) throw bad_request("--sizes: " + std::to_string(s) + " is not a positive multiple of 4 bytes");
  for (auto w : windows)
    if (w < 1 || w > 1024) throw bad_request("--windows: " + std::to_string(w) + " is not in [1, 1024]");
  if (!(cell_seconds > 0)) throw bad_request("--cell-seconds must be > 0");
  if (!coordinator.empty()) parse_host_port(coordinator);
  staleness_bound("bsp");
  push_codec();
  pull_codec();
  if (!(checkpoint_seconds >= 0) || checkpoint_seconds > 1e6)
    throw bad_request("--checkpoint-seconds must be in [0, 1e6]");
  if (!checkpoint_dir.empty() && checkpoint_every == 0 && checkpoint_seconds == 0)
    throw bad_request("--checkpoint-dir needs --checkpoint-every=K (K >= 1 clocks) or --checkpoint-seconds=T");
  if ((checkpoint_every > 0 || checkpoint_seconds > 0) && checkpoint_dir.empty())
    throw bad_request(std::string(checkpoint_every > 0 ? "--checkpoint-every" : "--checkpoint-seconds") +
                      " needs --checkpoint-dir=DIR");
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

  if (!restore.empty() && !std::filesystem::is_directory(restore))
    throw bad_request("--restore=" + restore + ": no such directory");
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
  // processes in CAF-NOTES §3/§8; bench_kv re-measures it (README).
  if (!caf::get_if<caf::atom_value>(&cfg, "scheduler.policy"))
    cfg.set("scheduler.policy", caf::atom("sharing"));
  // Failure detection of hung or cut-off peers (a killed one is noticed at once anyway):
  // heartbeats, and a deadline for silence. Explicit middleman.* settings win.
  if (cfg.heartbeat_ms > 0 && !caf::get_if<caf::timespan>(&cfg, "middleman.heartbeat-interval")) {
    cfg.set("middleman.heartbeat-interval", caf::timespan{milliseconds(cfg.heartbeat_ms)});
    cfg.set("middleman.connection-timeout", caf::timespan{milliseconds(cfg.failure_timeout_ms)});
  }
  // Value blocks of MiBs come and go many times a second. glibc would map each afresh
  // and fault its pages in (then zero them); from the heap, freed blocks are reused.
  // Costs: up to 1 GiB freed memory kept before it is given back. (bench_kv, README)
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

std::pair<std::string, std::uint16_t> parse_host_port(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    throw bad_request("address \"" + s + "\" is not HOST:PORT");
  auto port_str = s.substr(colon + 1);
  auto port = parse_count(port_str).value_or(0);
  if (port == 0 || port > 65535)
    throw bad_request("address \"" + s + "\": port \"" + port_str + "\" is not in [1, 65535]");
  return {s.substr(0, colon), static_cast<std::uint16_t>(port)};
}

update_rule rule_from(const node_config& cfg, const std::string& default_rule) {
  update_rule r;
  r.kind = update_rule::parse_kind(cfg.rule.empty() ? default_rule : cfg.rule);
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
  o.replication = static_cast<std::uint32_t>(cfg.replication);
  o.spec = settings.spec;
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
  o.faults = cfg.fault_spec();
  o.forward_timeout = milliseconds(cfg.timeout_ms);
  o.given = given_settings(cfg);
  return o;
}

// ---- worker ---------------------------------------------------------------------------

namespace {

// remote_actor, tried up to 3 times: with heartbeats on, CAF 0.17 drops an outgoing
// connection whose handshake is still open when a heartbeat tick comes (CAF-NOTES §4),
// so a connect can fail for no reason of the peer's.
template <class Handle>
caf::expected<Handle> connect_to(caf::actor_system& sys, const std::string& host, std::uint16_t port) {
  auto h = sys.middleman().remote_actor<Handle>(host, port);
  for (int attempt = 1; !h && attempt < 3; ++attempt) {
    std::this_thread::sleep_for(milliseconds(20 * attempt));  // back off before the next try
    h = sys.middleman().remote_actor<Handle>(host, port);
  }
  return h;
}

// Lost requests are sent again after --ps.retry-ms; the fault injector's message faults
// need it (a dropped request is otherwise never answered).
milliseconds retry_interval(const node_config& cfg) {
  if (cfg.retry_ms > 0) return milliseconds(cfg.retry_ms);
  return cfg.fault_spec().touches_messages() ? milliseconds(200) : milliseconds(0);
}

}  // namespace

std::shared_ptr<data_plane> data_plane_from(const node_config& cfg) {
  if (cfg.data_plane_bytes == 0) return nullptr;
  // A payload is written before its message is sent, so it is late only when its sender
  // is cut off: a claim waits as long as silence from a peer is tolerated, not a request.
  auto patience = milliseconds(std::min(cfg.timeout_ms, cfg.failure_timeout_ms));
  return std::make_shared<data_plane>(cfg.host, cfg.data_plane_bytes, patience, patience);
}

// The scoped actor that registered stays alive until `done` is sent: the coordinator
// monitors it, and its end means the worker is gone.

namespace {

// The job's spec from a registration; throws bad_request when it is damaged.
job_spec spec_from(const job_spec_msg& m) {
  auto spec = job_spec::from_parts(m.version, m.settings, m.tensors);
  if (spec.fingerprint() != m.fingerprint)
    throw bad_request("the job spec from the coordinator does not match its fingerprint");
  return spec;
}

}  // namespace

bool run_worker(caf::actor_system& sys, const node_config& cfg, coordinator_actor coord,
                const app_fn& app, std::string* error_out, std::shared_ptr<data_plane> plane,
                const spec_fn& on_spec, errc* code_out) {
  caf::scoped_actor self{sys};
  registration reg;
  std::string err;
  errc code = errc::failed;
  node_info me{"worker", cfg.host, 0, static_cast<std::uint32_t>(getpid()), {}, 0, 0, protocol_version,
               given_settings(cfg)};
  self->request(coord, milliseconds(cfg.register_timeout_ms), register_atom::value, me)
    .receive([&](registration& r) { reg = std::move(r); },
             [&](caf::error& e) {
               code = code_of(e);
               err = "worker: registration with the coordinator failed: " + describe(e);
             });
  std::uint32_t id = reg.id;
  auto fail = [&](errc c, std::string text) {
    if (error_out) *error_out = std::move(text);
    if (code_out) *code_out = c;
    return false;
  };
  // A failure caused by the job's end (the coordinator tells its workers how it ended
  // before it fails their requests) takes that end's code.
  auto job_end_code = [&] {
    errc c = errc::failed;
    self->receive([&](stop_atom, std::uint8_t code, std::string&) { c = static_cast<errc>(code); },
                  caf::after(milliseconds(0)) >> [] {});
    return c;
  };
  auto finish = [&](const std::string& text, bool ok) {
    self->send(coord, done_atom::value, id,
               ok ? text : std::string("{\"error\":") + caf::deep_to_string(text) + "}");
    return ok ? true : fail(job_end_code(), text);
  };
  if (!err.empty()) return fail(code, err);
  try {
    auto spec = spec_from(reg.spec);
    if (on_spec) on_spec(spec);
  } catch (const bad_request& e) {
    return finish(std::string("worker ") + std::to_string(id) + ": " + e.what(), false);
  }
  std::vector<shard_link> links;
  for (const auto& s : reg.view.shards) {
    std::string name = "shard " + std::to_string(s.id);
    if (s.handle) {
      links.push_back({s.id, name, caf::actor_cast<shard_actor>(s.handle)});
      continue;
    }
    name += " (" + s.host + ":" + std::to_string(s.port) + ", pid " + std::to_string(s.pid) + ")";
    auto h = connect_to<shard_actor>(sys, s.host, s.port);
    if (!h)
      return finish("worker " + std::to_string(id) + ": cannot connect to " + name + ": " +
                      describe(h.error()), false);
    links.push_back({s.id, name, *h});
  }
  try {
    kv_client kv(sys, reg.view, std::move(links),
                 {id, cfg.chunk_bytes, milliseconds(cfg.timeout_ms), cfg.inflight_bytes, cfg.push_codec(),
                  caf::actor_cast<caf::actor>(coord), cfg.fault_spec().kill_clock(fault_plan::role::worker, id),
                  retry_interval(cfg), cfg.fault_spec(), plane, cfg.pull_codec()});
    worker_context ctx{sys, cfg, id, reg.view.num_workers, reg.view, kv, reg.start_clock, {}, {}};
    // A joiner entered each shard's clock vector at that shard's minimum; one tick puts it
    // at the start clock everywhere (else its first read would wait for itself).
    if (reg.start_clock > 0) kv.advance_clock(reg.start_clock).get();
    ctx.barrier = [&] {
      std::string berr;
      self->request(coord, milliseconds(cfg.barrier_timeout_ms), barrier_atom::value, id)
        .receive([](std::uint64_t) {}, [&](caf::error& e) { berr = describe(e); });
      if (!berr.empty())
        throw kv_error("worker " + std::to_string(id) + ": barrier failed: " + berr);
    };
    ctx.report = [&](std::string text) { self->send(coord, report_atom::value, id, std::move(text)); };
    auto result = app(ctx);
    return finish(result, true);
  } catch (const std::exception& e) {
    return finish("worker " + std::to_string(id) + ": " + e.what(), false);
  }
}

// ---- launcher -------------------------------------------------------------------------

namespace {

struct child {
  pid_t pid;
  std::string name;
  bool server = false;
  bool exited = false;
  int status = 0;
};

pid_t spawn_process(const std::string& exe, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // A local cluster runs several processes per core: OpenMP teams inside each (the host
  // kernels) would spin against each other (softmax demo: 82 k samples/s with teams,
  // 100-118 k with one thread each). Children get one OpenMP thread unless the user says.
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) env_store.emplace_back(*e);
  auto set_default = [&](const std::string& name, const std::string& value) {
    for (const auto& e : env_store)
      if (e.rfind(name + "=", 0) == 0) return;
    env_store.push_back(name + "=" + value);
  };
  set_default("OMP_NUM_THREADS", "1");
  set_default("OMP_WAIT_POLICY", "passive");
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  // The launcher's stdout is its own JSON result: a child's status line goes to stderr.
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_adddup2(&files, STDERR_FILENO, STDOUT_FILENO);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, exe.c_str(), &files, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&files);
  if (rc != 0) throw bad_request("cannot start " + exe + ": " + std::strerror(rc));
  return pid;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

std::string psnode_path() {
  auto self = std::filesystem::read_symlink("/proc/self/exe");
  return (self.parent_path() / "psnode").string();
}

// Arguments for a psnode child: this process's own flags (they share one option set),
// minus the ones that say what this process is, plus the child's role.
std::vector<std::string> child_args(const node_config& cfg, std::vector<std::string> extra) {
  std::vector<std::string> out;
  for (const auto& a : cfg.args)
    if (a.rfind("--role=", 0) != 0 && a.rfind("--coordinator=", 0) != 0 &&
        a.rfind("--app=", 0) != 0 && a.rfind("--port=", 0) != 0)
      out.push_back(a);
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

}  // namespace

pid_t spawn_psnode(const std::vector<std::string>& args) {
  return spawn_process(psnode_path(), args);
}

namespace {

// What this job's checkpoints say about it (the clock is filled in per file).
checkpoint_header job_header(const node_config& cfg, const job_settings& settings, const std::string& app_name) {
  checkpoint_header h;
  h.model = app_name + "/" + cfg.model;
  h.epoch = 1;
  for (std::uint32_t i = 0; i < cfg.servers; ++i) h.shard_ids.push_back(i);
  h.vnodes = static_cast<std::uint32_t>(cfg.vnodes);
  h.bucket_bits = settings.bucket_bits;
  h.rule = static_cast<std::uint8_t>(settings.rule.kind);
  h.state_slots = static_cast<std::uint32_t>(settings.rule.state_slots());
  return h;
}

// The checkpoint writer, when --checkpoint-dir is given (else an empty handle).
caf::actor spawn_checkpointer(caf::actor_system& sys, const node_config& cfg, const job_settings& settings,
                              const std::string& app_name, caf::actor observer) {
  if (cfg.checkpoint_dir.empty()) return {};
  checkpointer_options o;
  o.dir = cfg.checkpoint_dir;
  o.observer = observer;
  o.header = job_header(cfg, settings, app_name);
  return sys.spawn(checkpointer, o);
}

// --restore: the newest intact checkpoint in the directory, if it fits this job; throws
// bad_request naming the file and the mismatch. Refused newer files are told on stderr.
std::shared_ptr<const checkpoint> load_restore(const node_config& cfg, const job_settings& settings,
                                               const std::string& app_name) {
  if (cfg.restore.empty()) return nullptr;
  auto latest = load_latest(cfg.restore);
  for (const auto& r : latest.refused) std::fprintf(stderr, "restore: skipped %s\n", r.c_str());
  if (!latest.found) throw bad_request("--restore=" + cfg.restore + ": no intact checkpoint in it");
  const auto& got = latest.found->header;
  auto want = job_header(cfg, settings, app_name);
  auto mismatch = [&](const std::string& what, const std::string& have, const std::string& need) {
    throw bad_request(latest.path + ": cannot restore: it holds " + what + " " + have + ", this job has " + need);
  };
  if (got.model != want.model) mismatch("model", got.model, want.model);
  if (got.shard_ids != want.shard_ids)
    mismatch("shards", std::to_string(got.shard_ids.size()), std::to_string(want.shard_ids.size()));
  if (got.vnodes != want.vnodes) mismatch("vnodes", std::to_string(got.vnodes), std::to_string(want.vnodes));
  if (got.bucket_bits != want.bucket_bits)
    mismatch("bucket bits", std::to_string(got.bucket_bits), std::to_string(want.bucket_bits));
  if (got.rule != want.rule || got.state_slots != want.state_slots)
    mismatch("update rule", update_rule::name(static_cast<rule_kind>(got.rule)), update_rule::name(settings.rule.kind));
  std::fprintf(stderr, "restore: parameters from %s (clock %llu)\n", latest.path.c_str(),
               static_cast<unsigned long long>(got.clock));
  return std::make_shared<const checkpoint>(std::move(*latest.found));
}

// A job starts a fresh trace: the shards only ever append.
bool start_trace(const node_config& cfg, std::string* error) {
  if (cfg.trace.empty()) return true;
  std::FILE* f = std::fopen(cfg.trace.c_str(), "w");
  if (!f) {
    *error = "cannot create trace file " + cfg.trace + ": " + std::strerror(errno);
    return false;
  }
  std::fclose(f);
  return true;
}

}  // namespace

bool job_result::stopped() const {
  return code == errc::stopped || code == errc::interrupted || code == errc::terminated;
}

bool watch_coordinator(caf::scoped_actor& observer, const coordinator_actor& coord, job_result& res,
                       const report_fn& on_report, const std::function<void()>& tick) {
  bool ended = false, stop_asked = false;
  observer->monitor(coord);
  while (!ended && res.failures.empty()) {
    observer->receive(
      [&](report_atom, std::uint32_t w, std::string& text) { on_report(w, text); },
      [&](done_atom, std::uint32_t w, std::string& text) { res.results[w] = std::move(text); },
      [&](failed_atom, std::string& text) { res.failures.push_back(std::move(text)); },
      [&](caf::down_msg& dm) {
        ended = true;
        if (dm.reason && dm.reason != caf::exit_reason::user_shutdown) {
          res.code = code_of(dm.reason);
          res.reason = describe(dm.reason);
        }
      },
      caf::after(milliseconds(100)) >> [&] {
        if (int sig = stop_signal(); sig != 0 && !stop_asked) {
          stop_asked = true;
          auto code = sig == SIGINT ? errc::interrupted : errc::terminated;
          caf::anon_send(coord, stop_atom::value, static_cast<std::uint8_t>(code),
                         std::string("stopped by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + " on the coordinator");
        }
        if (tick) tick();
      });
  }
  if (res.reason.empty() && !res.failures.empty()) res.reason = res.failures.front();
  return ended;
}

job_result run_job(caf::actor_system& sys, const node_config& cfg, const app_fn& app,
                   const std::string& app_name, const job_settings& settings, const report_fn& on_report) {
  job_result res;
  if (std::string err; !start_trace(cfg, &err)) {
    res.failures.push_back(err);
    return res;
  }
  auto start = std::chrono::steady_clock::now();
  caf::scoped_actor observer{sys};
  auto copts = coordinator_options_from(cfg, settings);
  try {
    copts.restore = load_restore(cfg, settings, app_name);
  } catch (const bad_request& e) {
    res.failures.push_back(e.what());
    return res;
  }
  copts.observer = caf::actor_cast<caf::actor>(observer);
  copts.checkpointer = spawn_checkpointer(sys, cfg, settings, app_name, copts.observer);
  auto coord = sys.spawn(coordinator, copts);
  std::vector<child> children;
  std::vector<std::thread> threads;
  std::vector<std::string> thread_errors(cfg.workers);
  bool embedded = cfg.cluster == "embedded";
  if (embedded) {
    auto sopts = shard_options_from(cfg, "");
    for (std::size_t i = 0; i < cfg.servers; ++i) {
      auto s = sys.spawn(server_shard, coord, sopts);
      caf::anon_send(s, start_atom::value, std::uint16_t{0});
    }
    for (std::size_t i = 0; i < cfg.workers; ++i)
      threads.emplace_back([&, i] { run_worker(sys, cfg, coord, app, &thread_errors[i]); });
  } else {
    auto port = sys.middleman().publish(coord, 0, "127.0.0.1");
    if (!port) {
      res.failures.push_back("cannot publish the coordinator: " + describe(port.error()));
      caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
      return res;
    }
    auto addr = "--coordinator=127.0.0.1:" + std::to_string(*port);
    std::fprintf(stderr, "coordinator listening on 127.0.0.1:%u (more workers can join: psnode --role=worker %s --app=%s)\n",
                 *port, addr.c_str(), app_name.c_str());
    auto exe = psnode_path();
    try {
      for (std::size_t i = 0; i < cfg.servers; ++i)
        children.push_back({spawn_process(exe, child_args(cfg, {"--role=server", addr})),
                            "server process " + std::to_string(i), true});
      for (std::size_t i = 0; i < cfg.workers; ++i)
        children.push_back({spawn_process(exe, child_args(cfg, {"--role=worker", addr, "--app=" + app_name})),
                            "worker process " + std::to_string(i)});
    } catch (const bad_request& e) {
      res.failures.push_back(e.what());
    }
  }
  // Processes the fault plan kills (SIGKILL, by themselves) are expected to vanish.
  std::size_t server_kills = 0, worker_kills = 0;
  for (const auto& k : cfg.fault_spec().kills) ++(k.who == fault_plan::role::server ? server_kills : worker_kills);
  // True for a clean exit, and for the fault plan's kills (noted in faults_seen).
  auto planned_kill = [&](const child& c) {
    if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) return true;
    auto& budget = c.server ? server_kills : worker_kills;
    if (!(WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL && budget > 0)) return false;
    --budget;
    res.faults_seen.push_back(c.name + " (pid " + std::to_string(c.pid) + ") " + describe_status(c.status));
    return true;
  };
  // Collect reports until the coordinator ends (all workers done) or something fails.
  bool coordinator_ended = watch_coordinator(observer, coord, res, on_report, [&] {
    for (auto& c : children) {
      if (c.exited) continue;
      if (waitpid(c.pid, &c.status, WNOHANG) == c.pid) {
        c.exited = true;
        if (!planned_kill(c))
          res.failures.push_back(c.name + " (pid " + std::to_string(c.pid) + ") " + describe_status(c.status) +
                                 " before the job finished");
      }
    }
  });
  if (!coordinator_ended) caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  // Handles sent to other processes keep it registered with the middleman: end it here.
  if (copts.checkpointer) caf::anon_send_exit(copts.checkpointer, caf::exit_reason::user_shutdown);
  for (auto& t : threads) t.join();
  for (const auto& e : thread_errors)
    if (!e.empty()) res.failures.push_back(e);
  // Children leave on their own once the coordinator is gone; make sure of it.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(res.failures.empty() ? 10 : 0);
  for (auto& c : children) {
    while (!c.exited) {
      if (waitpid(c.pid, &c.status, WNOHANG) == c.pid) {
        c.exited = true;
        planned_kill(c);  // only to note the fault plan's kills: the job is over
      } else if (std::chrono::steady_clock::now() >= deadline) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &c.status, 0);
        c.exited = true;
      } else {
        std::this_thread::sleep_for(milliseconds(5));  // polling child exit; no event to wait on
      }
    }
  }
  for (const auto& [w, text] : res.results)
    if (text.rfind("{\"error\"", 0) == 0) res.failures.push_back("worker " + std::to_string(w) + ": " + text);
  std::size_t workers_killed = 0;
  for (const auto& k : cfg.fault_spec().kills) workers_killed += k.who == fault_plan::role::worker;
  if (res.failures.empty() && res.results.size() + workers_killed < cfg.workers)
    res.failures.push_back("only " + std::to_string(res.results.size()) + " of " +
                           std::to_string(cfg.workers) + " workers reported a result");
  res.ok = res.failures.empty() && !res.stopped();
  if (res.reason.empty() && !res.failures.empty()) res.reason = res.failures.front();
  if (!res.ok && !res.stopped() && res.code != errc::refused) res.code = errc::job_failed;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

// ---- psnode roles -----------------------------------------------------------------------

namespace {

caf::expected<coordinator_actor> connect_coordinator(caf::actor_system& sys, const node_config& cfg) {
  if (cfg.coordinator.empty())
    return make_ps_error("--coordinator=HOST:PORT is required for --role=" + cfg.role);
  auto [host, port] = parse_host_port(cfg.coordinator);
  auto h = connect_to<coordinator_actor>(sys, host, port);
  if (!h)
    return make_ps_error("cannot reach the coordinator at " + cfg.coordinator + ": " + describe(h.error()));
  return *h;
}

}  // namespace

namespace {

// The observer's progress lines of a coordinator role: the cluster's news as they are,
// a worker's progress under its id.
void print_report(std::uint32_t w, const std::string& text) {
  if (w == UINT32_MAX)
    std::fprintf(stderr, "%s\n", text.c_str());
  else
    std::fprintf(stderr, "worker %u: %s\n", w, text.c_str());
}

}  // namespace

int print_status(json_line line, bool ok, errc code, const std::string& reason) {
  line["status"] = ok ? "ok" : status_of(code);
  if (!ok) line["reason"] = reason;
  std::fflush(stderr);
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
  return ok ? 0 : exit_status_of(code);
}

int run_coordinator_role(caf::actor_system& sys, const node_config& cfg, const job_settings& settings) {
  json_line line{{"role", "coordinator"}, {"app", cfg.app}, {"job_fingerprint", fingerprint_text(settings.spec)}};
  if (std::string err; !start_trace(cfg, &err)) return print_status(line, false, errc::failed, err);
  caf::scoped_actor observer{sys};
  auto copts = coordinator_options_from(cfg, settings);
  copts.observer = caf::actor_cast<caf::actor>(observer);
  try {
    copts.restore = load_restore(cfg, settings, cfg.app);
  } catch (const bad_request& e) {
    return print_status(line, false, errc::failed, e.what());
  }
  copts.checkpointer = spawn_checkpointer(sys, cfg, settings, cfg.app, copts.observer);
  auto coord = sys.spawn(coordinator, copts);
  auto port = sys.middleman().publish(coord, cfg.port, cfg.host.c_str());
  if (!port) {
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    return print_status(line, false, errc::failed, "cannot listen on " + cfg.host + ":" + std::to_string(cfg.port) +
                                                     ": " + describe(port.error()));
  }
  std::fprintf(stderr, "coordinator listening on %s:%u, waiting for %zu servers and %zu workers (job %s)\n",
               cfg.host.c_str(), *port, cfg.servers, cfg.workers, fingerprint_text(settings.spec).c_str());
  auto start = std::chrono::steady_clock::now();
  job_result res;
  if (!watch_coordinator(observer, coord, res, print_report)) caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  if (copts.checkpointer) caf::anon_send_exit(copts.checkpointer, caf::exit_reason::user_shutdown);
  for (const auto& [w, text] : res.results) {
    std::fprintf(stderr, "worker %u finished: %s\n", w, text.c_str());
    if (text.rfind("{\"error\"", 0) == 0) res.failures.push_back("worker " + std::to_string(w) + ": " + text);
  }
  bool ok = res.reason.empty() && res.failures.empty();
  if (!ok && !res.stopped() && res.code != errc::refused) res.code = errc::job_failed;
  line["workers_reporting"] = res.results.size();
  line["shard_keys"] = shard_keys(cfg, settings.spec);
  line["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return print_status(line, ok, res.code, res.reason.empty() && !res.failures.empty() ? res.failures.front() : res.reason);
}

int run_server_role(caf::actor_system& sys, const node_config& cfg) {
  json_line line{{"role", "server"}};
  auto coord = connect_coordinator(sys, cfg);
  if (!coord) return print_status(line, false, errc::failed, describe(coord.error()));
  auto sopts = shard_options_from(cfg, cfg.host);
  sopts.plane = data_plane_from(cfg);  // cannot listen: bad_request, reported by psnode
  auto shard = sys.spawn(server_shard, *coord, sopts);
  auto port = sys.middleman().publish(shard, 0, cfg.host.c_str());
  if (!port) {
    caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
    return print_status(line, false, errc::failed, "server cannot listen on " + cfg.host + ": " + describe(port.error()));
  }
  caf::anon_send(shard, start_atom::value, *port);
  caf::scoped_actor self{sys};
  self->monitor(shard);
  caf::error reason;
  self->receive([&](caf::down_msg& dm) { reason = dm.reason; });  // the shard ends with the job, or on a fatal error
  bool ok = !reason || reason == caf::exit_reason::normal;
  return print_status(line, ok, code_of(reason), ok ? "" : describe(reason));
}

int run_worker_role(caf::actor_system& sys, node_config& cfg, const app_fn& app) {
  json_line line{{"role", "worker"}, {"app", cfg.app}};
  auto coord = connect_coordinator(sys, cfg);
  if (!coord) return print_status(line, false, errc::failed, describe(coord.error()));
  std::string err;
  errc code = errc::failed;
  auto adopt_spec = [&](const job_spec& spec) {
    adopt(cfg, spec);
    line["job_fingerprint"] = fingerprint_text(spec);
  };
  bool ok = run_worker(sys, cfg, *coord, app, &err, data_plane_from(cfg), adopt_spec, &code);
  if (!ok) std::fprintf(stderr, "error: %s\n", err.c_str());
  return print_status(line, ok, code, err);
}

int run_local_role(caf::actor_system& sys, const node_config& cfg, const app_fn& app, const job_settings& settings) {
  auto res = run_job(sys, cfg, app, cfg.app, settings, [](std::uint32_t w, const std::string& text) {
    if (w == UINT32_MAX)
      std::fprintf(stderr, "%s\n", text.c_str());
    else
      std::fprintf(stderr, "[worker %u] %s\n", w, text.c_str());
  });
  for (const auto& [w, text] : res.results) std::printf("%s\n", text.c_str());
  for (const auto& f : res.failures) std::fprintf(stderr, "error: %s\n", f.c_str());
  json_line line{{"app", cfg.app},
                      {"ok", res.ok},
                      {"workers_reporting", res.results.size()},
                      {"killed_by_faults", res.faults_seen},
                      {"seconds", res.seconds},
                      {"shard_keys", shard_keys(cfg, settings.spec)}};
  return print_status(line, res.ok, res.code, res.reason);
}

}  // namespace ps
