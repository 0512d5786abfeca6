// A worker's life: register with the coordinator (adopting the job's spec), connect to
// the shards, run the app, report its result.
#include "runtime/node_parts.hpp"

#include <unistd.h>

#include <cstdio>

#include "actors/transport.hpp"
#include "runtime/job_contract.hpp"
#include "runtime/signals.hpp"

namespace ps {

using std::chrono::milliseconds;

// ---- worker ---------------------------------------------------------------------------

namespace {


// Lost requests are sent again after --ps.retry-ms; the fault injector's message faults
// need it (a dropped request is otherwise never answered).
milliseconds retry_interval(const node_config& cfg) {
  if (cfg.retry_ms > 0) return milliseconds(cfg.retry_ms);
  return cfg.fault_spec().touches_messages() ? milliseconds(200) : milliseconds(0);
}

// A worker process told to stop (SIGTERM, SIGINT) leaves at its first tick a second or more
// after the signal, as a server does: a scheduler that stops the whole job signals every
// member at once, and the coordinator's stop then ends this worker first (the job ends
// "stopped").
bool asked_to_leave() { return stop_signal_older_than(std::chrono::seconds(1)); }

// The app stopped at a tick: out of every shard's clock vector (behind its pushes, so they
// count), and the result that says so.
std::string leave_job(kv_client& kv, std::uint32_t id, const worker_leaving& why, std::string* left_out) {
  kv.leave_clock_vector().get();
  std::fprintf(stderr, "worker %u: %s\n", id, why.what());
  if (left_out) *left_out = why.what();
  return json_line{{"worker", id}, {"left", why.what()}, {"left_before_clock", why.clock}}.dump();
}

}  // namespace

void report_progress(worker_context& ctx, progress_report r) {
  std::tie(r.push_latency, r.pull_latency) = ctx.kv.take_latencies();
  ctx.report(r.to_json());
}

std::shared_ptr<transport> transport_from(caf::actor_system& sys, const node_config& cfg) {
  if (cfg.data_plane_bytes == 0) return nullptr;
  transport_settings s;
  auto at = cfg.endpoint_of();
  s.bind_host = at.bind_host;
  s.advertised_host = at.advertise_host;
  s.port = cfg.data_plane_port;
  s.min_bytes = cfg.data_plane_bytes;
  // A payload is written before its message is sent, so it is late only when its sender
  // is cut off: a claim waits as long as silence from a peer is tolerated, not a request.
  s.claim_timeout = s.stall_timeout = milliseconds(std::min(cfg.timeout_ms, cfg.failure_timeout_ms));
  if (!cfg.secret_file.empty()) s.secret = read_secret_file(cfg.secret_file);
  s.ring_bytes = cfg.offered_ring_bytes();
  s.busy_poll = std::chrono::microseconds(cfg.busy_poll_us);
  s.tcp_congestion = cfg.tcp_congestion;
  if (cfg.direct_requests != 0) s.messages_in = &sys;
  return transport_kind_named(cfg.transport).make(s);
}

reconnect_options reconnect_from(caf::actor_system& sys, const node_config& cfg) {
  reconnect_options o;
  if (cfg.coordinator.empty()) return o;
  auto [host, port] = parse_host_port(cfg.coordinator);
  o.dial = [&sys, host = host, port = port] { return connect_to<coordinator_actor>(sys, host, port); };
  o.address = cfg.coordinator;
  o.patience = milliseconds(cfg.failure_timeout_ms);
  return o;
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

// A link to every shard of the map: embedded ones as they are, published ones dialled
// directly. *error names the first that cannot be reached (the links are then incomplete).
std::vector<shard_link> connect_shards(caf::actor_system& sys, const cluster_view& view, std::string* error) {
  std::vector<shard_link> links;
  for (const auto& s : view.shards) {
    std::string name = "shard " + std::to_string(s.id);
    if (s.handle && s.host.empty()) {  // embedded: no network (a published shard is dialled directly)
      links.push_back({s.id, name, caf::actor_cast<shard_actor>(s.handle)});
      continue;
    }
    name += " (" + s.host + ":" + std::to_string(s.port) + ", pid " + std::to_string(s.pid) + ")";
    auto h = connect_to<shard_actor>(sys, s.host, s.port);
    if (!h) {
      *error = "cannot connect to " + name + ": " + describe(h.error());
      return links;
    }
    links.push_back({s.id, name, *h});
  }
  return links;
}

// The worker's client: the flags' wire and fault settings, the coordinator it registered
// with (and how to find it again), `worker` (the registered actor) and its first barrier.
kv_client_options client_options(caf::actor_system& sys, const node_config& cfg, const coordinator_actor& coord,
                                 caf::actor worker, const registration& reg, std::shared_ptr<transport> plane) {
  kv_client_options o{reg.id, cfg.chunk_bytes, milliseconds(cfg.timeout_ms), cfg.inflight_bytes, cfg.push_codec(),
          coord, cfg.fault_spec().kill_clock(fault_plan::role::worker, reg.id),
          retry_interval(cfg), cfg.fault_spec(), std::move(plane), cfg.pull_codec(),
          [&sys](const std::string& host, std::uint16_t port) { connect_to<shard_actor>(sys, host, port); },
          reconnect_from(sys, cfg), std::move(worker), reg.barrier_generation, cfg.push_chunk_bytes,
          cfg.crowded_inflight_bytes, cfg.tcp_push_chunk_bytes, cfg.caller_runs != 0};
  o.tensors = reg.spec.tensors;
  if (cfg.role == "worker") o.leave_requested = asked_to_leave;  // a process of its own: its signals are its
  return o;
}

}  // namespace

namespace {

// One run_worker's end, said through error_out and code_out.
struct worker_run {
  caf::scoped_actor& self;
  const coordinator_actor& coord;
  std::string* error_out;
  errc* code_out;
  std::uint32_t id = 0;
  // The worker's end goes through its client once there is one: the client waits for the
  // coordinator's acknowledgment, across a restart of the coordinator.
  kv_client* client = nullptr;

  bool fail(errc c, std::string text) {
    if (error_out) *error_out = std::move(text);
    if (code_out) *code_out = c;
    return false;
  }

  // A failure caused by the job's end (the coordinator tells its workers how it ended
  // before it fails their requests) takes that end's code.
  errc job_end_code() {
    errc c = errc::failed;
    self->receive([&](stop_atom, std::uint8_t code, std::string&) { c = static_cast<errc>(code); },
                  caf::after(milliseconds(0)) >> [] {});
    return c;
  }

  bool finish(const std::string& text, bool ok) {
    worker_result result{id, ok, ok ? text : json_line{{"error", text}}.dump()};
    if (!client) {
      self->send(coord, done_atom::value, result);
    } else {
      try {
        client->finish(result);
      } catch (const kv_error& e) {
        return fail(job_end_code(), ok ? std::string(e.what()) : text + "; " + e.what());
      }
    }
    return ok ? true : fail(job_end_code(), text);
  }
};

// The registration, or nullopt with why (and its code) in err and code.
std::optional<registration> register_worker(caf::scoped_actor& self, const node_config& cfg, const coordinator_actor& coord,
                                            std::string& err, errc& code) {
  std::optional<registration> reg;
  node_info me{"worker", cfg.endpoint_of().advertise_host, 0, static_cast<std::uint32_t>(getpid()), {}, 0, 0, protocol_version,
               given_settings(cfg)};
  self->request(coord, milliseconds(cfg.register_timeout_ms), register_atom::value, me)
    .receive([&](registration& r) { reg = std::move(r); },
             [&](caf::error& e) {
               code = code_of(e);
               err = "worker: registration with the coordinator failed: " + describe(e);
             });
  return reg;
}

}  // namespace

bool run_worker(caf::actor_system& sys, const node_config& cfg, coordinator_actor coord,
                const app_fn& app, std::string* error_out, std::shared_ptr<transport> plane,
                const spec_fn& on_spec, errc* code_out, std::string* left_out) {
  caf::scoped_actor self{sys};
  std::string err;
  errc code = errc::failed;
  auto reg = register_worker(self, cfg, coord, err, code);
  worker_run run{self, coord, error_out, code_out};
  if (!reg) return run.fail(code, err);
  const auto id = run.id = reg->id;
  try {
    auto spec = spec_from(reg->spec);
    if (on_spec) on_spec(spec);
  } catch (const bad_request& e) {
    return run.finish(std::string("worker ") + std::to_string(id) + ": " + e.what(), false);
  }
  std::string unreachable;
  auto links = connect_shards(sys, reg->view, &unreachable);
  if (!unreachable.empty()) return run.finish("worker " + std::to_string(id) + ": " + unreachable, false);
  try {
    kv_client kv(sys, reg->view, std::move(links),
                 client_options(sys, cfg, coord, caf::actor_cast<caf::actor>(self), *reg, std::move(plane)));
    run.client = &kv;
    worker_context ctx{sys, cfg, id, reg->view.num_workers, reg->view, kv, reg->start_clock, {}, {}};
    // A joiner entered each shard's clock vector at that shard's minimum; one tick puts it
    // at the start clock everywhere (else its first read would wait for itself).
    if (reg->start_clock > 0) kv.advance_clock(reg->start_clock).get();
    ctx.barrier = [&] { kv.barrier(milliseconds(cfg.barrier_timeout_ms)); };
    ctx.report = [&](std::string text) { kv.report(std::move(text)); };
    std::string result;
    try {
      result = app(ctx);
    } catch (const worker_leaving& why) {
      result = leave_job(kv, id, why, left_out);
    }
    return run.finish(result, true);
  } catch (const std::exception& e) {
    run.client = nullptr;  // gone with the try block
    return run.finish("worker " + std::to_string(id) + ": " + e.what(), false);
  }
}

}  // namespace ps
