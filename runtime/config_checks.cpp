// node_config's checks: every setting in range and the combinations that cannot work,
// each refused with an error naming the flag.
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
#include "actors/transport.hpp"
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

// --ps.transport: a registered transport that connects processes (psnode's roles are).
void check_transport(const std::string& name) {
  try {
    if (transport_kind_named(name).between_processes) return;
  } catch (const bad_request& e) {
    throw bad_request(std::string("--ps.transport: ") + e.what());
  }
  throw bad_request("--ps.transport=" + name + " connects members of one process only (the simulator, tests); "
                    "psnode's roles are processes: use shm or tcp");
}

void one_of(const std::string& name, const std::string& v, const std::vector<std::string>& ok) {
  for (const auto& o : ok)
    if (v == o) return;
  std::string list;
  for (const auto& o : ok) list += (list.empty() ? "" : "|") + o;
  throw bad_request("--" + name + "=" + v + " is not one of " + list);
}

}  // namespace

void node_config::validate() const {
  if (!role.empty()) one_of("role", role, {"coordinator", "server", "worker", "local", "export", "describe"});
  if (!job_file.empty() && role != "coordinator")
    throw bad_request("--job-file is read by a coordinator (--role=coordinator); the other members learn the job "
                      "from it");
  if (role == "export" && (checkpoint_dir.empty() || out.empty()))
    throw bad_request("--role=export needs --checkpoint-dir=DIR (where the checkpoints are) and --out=DIR");
  one_of("cluster", cluster, {"embedded", "processes"});
  one_of("model", model, {"softmax", "mlp"});
  // Throws naming the known rules, or what is wrong with the rule's own parameters.
  if (!rule.empty() || !rule_params.empty()) rule_from(*this, effective_rule(*this));
  if (servers < 1 || servers > 1024) throw bad_request("--servers must be in [1, 1024]");
  if (workers < 1 || workers > 1024) throw bad_request("--workers must be in [1, 1024]");
  if (epochs < 1) throw bad_request("--epochs must be >= 1");
  if (batch < 1) throw bad_request("--batch must be >= 1");
  if (!(lr > 0)) throw bad_request("--lr must be > 0");
  validate_wire();
  for (const auto& flag : registered_app_flags())
    if (flag.check && declared(flag.name))
      if (auto wrong = flag.check(*this); !wrong.empty()) throw bad_request("--" + flag.name + ": " + wrong);
  validate_disk_tier();
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
  validate_training();
}

// The disk tier: eviction, handoff, readers, the budget and a directory that takes direct I/O.
void node_config::validate_disk_tier() const {
  eviction_policy_of(eviction);
  if (handoff != "copy-ahead" && handoff != "cut")
    throw bad_request("--handoff=" + handoff + ": must be copy-ahead or cut");
  if (disk_readers < 1 || disk_readers > 256) throw bad_request("--disk-readers=" + std::to_string(disk_readers) + ": must be 1 to 256");
  if (shard_memory > 0 && shard_memory < min_tier_budget) throw bad_request("--shard-memory must be 0 or at least 1 MiB");
  if (shard_memory > 0 && (role.empty() || role == "server" || role == "local"))
    if (auto why = direct_io_problem(shard_dir); !why.empty()) throw bad_request("--shard-dir: " + why);
}

// The training apps' own settings: devices' aggregation, the pipeline, stragglers, targets.
void node_config::validate_training() const {
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
  check_transport(transport);
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
  one_of("on-sigterm", on_sigterm, {"stop", "step-down"});
  if (on_sigterm == "step-down" && (role != "coordinator" || state_dir.empty()))
    throw bad_request("--on-sigterm=step-down is for psnode --role=coordinator with --state-dir=DIR (the coordinator "
                      "steps down leaving its saved state for one started again with --resume)");
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

}  // namespace ps
