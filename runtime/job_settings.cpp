// From a node_config to what the roles run with: codecs, stragglers, the runtime's
// defaults, the update rule, the job's settings, the coordinator's and a shard's options,
// this node's endpoint.
#include "runtime/node_parts.hpp"

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


namespace ps {

using std::chrono::milliseconds;

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
  r.set_params(cfg.rule_params);
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
