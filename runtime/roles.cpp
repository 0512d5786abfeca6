// psnode's roles: coordinator, server, worker and local, each ending with its status line.
#include "libps/observe/log.hpp"
#include "runtime/node_parts.hpp"

#include <csignal>
#include <cstdio>
#include <thread>

#include "actors/server_shard.hpp"
#include "libps/persist/checkpoint_export.hpp"
#include "runtime/job_contract.hpp"
#include "runtime/health_endpoint.hpp"
#include "runtime/launch_env.hpp"
#include "runtime/signals.hpp"

namespace ps {

using std::chrono::milliseconds;

// ---- psnode roles -----------------------------------------------------------------------

namespace {

caf::expected<coordinator_actor> connect_coordinator(caf::actor_system& sys, const node_config& cfg) {
  if (cfg.coordinator.empty())
    return make_ps_error("--coordinator=HOST:PORT is required for --role=" + cfg.role);
  auto [host, port] = parse_host_port(cfg.coordinator);
  auto h = connect_to<coordinator_actor>(sys, host, port);
  // Under --layout every rank starts at once, and a pod may start before the coordinator's:
  // it may not listen yet. There, or when --ps.failure-timeout-ms is given, members wait.
  const bool waits = cfg.launch_rank || cfg.given.count("ps.failure-timeout-ms");
  const auto start = std::chrono::steady_clock::now();
  auto said = start;
  while (!h && waits && code_of(h.error()) != errc::refused &&
         std::chrono::steady_clock::now() - start < milliseconds(cfg.failure_timeout_ms)) {
    if (std::chrono::steady_clock::now() - said > std::chrono::seconds(5)) {
      std::fprintf(stderr, "%s: waiting for the coordinator at %s (%s)\n", cfg.role.c_str(), cfg.coordinator.c_str(),
                   describe(h.error()).c_str());
      said = std::chrono::steady_clock::now();
    }
    std::this_thread::sleep_for(milliseconds(100));  // a listener that is not there yet sends no message
    h = connect_to<coordinator_actor>(sys, host, port);
  }
  if (!h)
    return make_error(code_of(h.error()), "cannot reach the coordinator at " + cfg.coordinator + ": " + describe(h.error()));
  return *h;
}

// Publishes `who` where `at` says, with SO_REUSEADDR: a node started again on its port
// right after a stop binds at once (the old connections' TIME_WAIT would refuse it).
template <class Handle>
caf::expected<std::uint16_t> publish_at(const Handle& who, const endpoint& at) {
  auto port = guarded_publish(who, at.bind_port, at.every_interface() ? "" : at.bind_host, true);
  if (!port)
    return make_ps_error("cannot listen on " + at.bind_host + ":" + std::to_string(at.bind_port) + ": " +
                         describe(port.error()));
  return port;
}

// A member's status line; under --layout it names the launcher's rank.
json_line member_line(const node_config& cfg, json_line line) {
  if (cfg.launch_rank) line["rank"] = *cfg.launch_rank;
  return line;
}

}  // namespace


namespace {

// The workers' result lines, one JSON line each, before the status line.
void print_results(const job_result& res) {
  for (const auto& [w, text] : res.results) std::printf("%s\n", text.c_str());
}

// The replacements' loss events, one object per (shard, worker) report.
json_line losses_json(const std::vector<update_loss>& losses) {
  json_line all = json_line::array();
  for (const auto& l : losses)
    all.push_back({{"shard", l.shard}, {"worker", l.worker}, {"from_clock", l.from_clock},
                   {"lost_clocks", l.lost_clocks}, {"at_most", l.at_most}});
  return all;
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

int print_job_end(json_line line, const job_result& res, const std::function<void(json_line&)>& add_figures) {
  if (!res.ok) {
    for (const auto& f : res.failures) std::fprintf(stderr, "error: %s\n", f.c_str());
    return print_status(line, false, res.code, res.reason);
  }
  add_figures(line);
  return print_status(line, true, res.code, "");
}

int run_coordinator_role(caf::actor_system& sys, const node_config& cfg, const job_settings& settings,
                         const job_listener& listener) {
  auto line = member_line(cfg, {{"role", "coordinator"}, {"app", cfg.app}, {"job_fingerprint", fingerprint_text(settings.spec)}});
  caf::scoped_actor observer{sys};
  running_coordinator started;
  try {
    started = start_coordinator(sys, cfg, settings, cfg.app, caf::actor_cast<observer_actor>(observer));
  } catch (const bad_request& e) {
    return print_status(line, false, errc::failed, e.what());
  }
  auto coord = started.coord;
  auto at = cfg.endpoint_of();
  auto port = publish_at(coord, at);
  if (!port) {
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    return print_status(line, false, errc::failed, describe(port.error()));
  }
  health_ready();
  try {
    write_rendezvous(cfg, *port);
  } catch (const bad_request& e) {
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    return print_status(line, false, errc::failed, e.what());
  }
  if (logs(log_level::info) && cfg.resume)
    std::fprintf(stderr, "coordinator listening on %s:%u, resuming job %s; its members rejoin on their own\n",
                 at.bind_host.c_str(), *port, fingerprint_text(settings.spec).c_str());
  else if (logs(log_level::info))
    std::fprintf(stderr, "coordinator listening on %s:%u, waiting for %zu servers and %zu workers (job %s); members "
               "need only --coordinator=HOST:%u\n",
               at.bind_host.c_str(), *port, cfg.servers, cfg.workers, fingerprint_text(settings.spec).c_str(), *port);
  auto start = std::chrono::steady_clock::now();
  job_result res;
  if (!watch_coordinator(observer, coord, res, listener, cfg)) caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  started.end_checkpointer();
  print_results(res);
  // A worker that died while the others finished is no failure of the job here: its data
  // went to the others (the launcher, which knows the planned kills, counts results).
  conclude(res, std::nullopt);
  line["workers_reporting"] = res.results.size();
  line["updates_lost"] = losses_json(res.losses);
  line["shard_keys"] = final_shard_keys(cfg, settings, res);
  line["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return print_status(line, res.ok, res.code, res.reason);
}

int run_server_role(caf::actor_system& sys, const node_config& cfg) {
  auto line = member_line(cfg, {{"role", "server"}});
  auto coord = connect_coordinator(sys, cfg);
  if (!coord) return print_status(line, false, code_of(coord.error()), describe(coord.error()));
  auto at = cfg.endpoint_of();
  auto sopts = shard_options_from(cfg, at.advertise_host);
  sopts.plane = transport_from(sys, cfg);  // cannot listen: bad_request, reported by psnode
  sopts.reconnect = reconnect_from(sys, cfg);
  sopts.dial_shard = [&sys](const std::string& host, std::uint16_t port) {
    auto h = connect_to<shard_actor>(sys, host, port);
    return h ? *h : shard_actor{};
  };
  auto shard = sys.spawn(server_shard, *coord, sopts);
  auto port = publish_at(shard, at);
  if (!port) {
    caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
    return print_status(line, false, errc::failed, "server " + describe(port.error()));
  }
  caf::anon_send(shard, start_atom::value, at.advertise_port ? at.advertise_port : *port);
  health_ready();
  caf::scoped_actor self{sys};
  self->monitor(shard);
  caf::error reason;
  bool ended = false, asked_to_stop = false;
  errc stop_code = errc::terminated;
  std::string cannot_leave;
  while (!ended) {  // the shard ends with the job, on a fatal error, or once it has left
    self->receive([&](caf::down_msg& dm) { reason = dm.reason, ended = true; },
                  caf::after(milliseconds(100)) >> [] {});  // polls for a stop signal
    if (ended || asked_to_stop || stop_signal() == 0) continue;
    stop_code = stop_signal() == SIGINT ? errc::interrupted : errc::terminated;
    // A scheduler stopping the whole job signals every member at once: the coordinator then
    // stops the job, and this shard ends with it within the grace. Alone, it leaves.
    if (!stop_signal_older_than(milliseconds(1000))) continue;
    asked_to_stop = true;
    // Dialled again: the coordinator may have been restarted since (resumed, perhaps on
    // another host under the same name), and the handle of the first is dead.
    auto now_coord = connect_coordinator(sys, cfg);
    cannot_leave = drain_server(self, now_coord ? *now_coord : *coord, shard, line, stop_code);
  }
  bool ok = (!reason || reason == caf::exit_reason::normal) && cannot_leave.empty();
  if (sopts.plane) sopts.plane->quiet();
  if (!cannot_leave.empty()) return print_status(line, false, stop_code, cannot_leave);
  return print_status(line, ok, code_of(reason), ok ? "" : describe(reason));
}

int run_worker_role(caf::actor_system& sys, node_config& cfg, const app_fn& app) {
  auto line = member_line(cfg, {{"role", "worker"}, {"app", cfg.app}});
  auto coord = connect_coordinator(sys, cfg);
  if (!coord) return print_status(line, false, code_of(coord.error()), describe(coord.error()));
  std::string err;
  errc code = errc::failed;
  auto adopt_spec = [&](const job_spec& spec) {
    adopt(cfg, spec);
    line["job_fingerprint"] = fingerprint_text(spec);
    health_ready();  // registered
  };
  auto plane = transport_from(sys, cfg);
  std::string left;
  bool ok = run_worker(sys, cfg, *coord, app, &err, plane, adopt_spec, &code, &left);
  if (!ok) std::fprintf(stderr, "error: %s\n", err.c_str());
  if (!left.empty()) line["left"] = left;
  if (plane) plane->quiet();  // a connection the job's end closes late is not news after the status line
  return print_status(line, ok, code, err);
}

int run_local_role(caf::actor_system& sys, const node_config& cfg, const app_fn& app, const job_settings& settings,
                   const job_listener& listener) {
  auto res = run_job(sys, cfg, app, cfg.app, settings, listener);
  print_results(res);
  for (const auto& f : res.failures) std::fprintf(stderr, "error: %s\n", f.c_str());
  json_line line{{"app", cfg.app},
                      {"ok", res.ok},
                      {"workers_reporting", res.results.size()},
                      {"killed_by_faults", res.faults_seen},
                      {"updates_lost", losses_json(res.losses)},
                      {"seconds", res.seconds},
                      {"shard_keys", final_shard_keys(cfg, settings, res)}};
  return print_status(line, res.ok, res.code, res.reason);
}

int run_export_role(const node_config& cfg, const job_settings& settings) {
  json_line line{{"role", "export"}, {"checkpoint_dir", cfg.checkpoint_dir}, {"out", cfg.out}};
  try {
    auto latest = load_latest(cfg.checkpoint_dir);
    for (const auto& r : latest.refused) std::fprintf(stderr, "export: skipped %s\n", r.c_str());
    if (!latest.found) return print_status(line, false, errc::failed, "no intact checkpoint in " + cfg.checkpoint_dir);
    if (auto why = non_finite_values(*latest.found); !why.empty())
      std::fprintf(stderr, "export: warning: %s: %s\n", latest.path.c_str(), why.c_str());
    auto files = export_checkpoint(*latest.found, settings.spec.tensors(), settings.tables, cfg.out);
    line["checkpoint"] = latest.path;
    line["clock"] = latest.found->header.clock;
    line["files"] = files.size();
    return print_status(line, true, errc::failed, "");
  } catch (const bad_request& e) {
    return print_status(line, false, errc::failed, e.what());
  }
}

}  // namespace ps
