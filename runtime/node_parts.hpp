#pragma once
// Pieces of the process wiring shared by its files (runtime/config.cpp, worker.cpp,
// launcher.cpp, roles.cpp); not part of the API.
#include <caf/io/all.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "actors/coordinator.hpp"
#include "libps/persist/checkpoint.hpp"
#include "runtime/guarded_net.hpp"
#include "runtime/node.hpp"

namespace ps {

// remote_actor through the guarded middleman (runtime/guarded_net.hpp), tried up to 3
// times: with heartbeats on, CAF 0.17 drops an outgoing connection whose handshake is
// still open when a heartbeat tick comes (docs/wire-and-caf.md, "CAF 0.17 facts"), so a connect can fail for no
// reason of the peer's.
template <class Handle>
caf::expected<Handle> connect_to(caf::actor_system& sys, const std::string& host, std::uint16_t port) {
  auto h = guarded_remote_actor<Handle>(sys, host, port);
  // A peer that refused us (the shared secret, its checks) would refuse again.
  for (int attempt = 1; !h && attempt < 3 && code_of(h.error()) != errc::refused; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20 * attempt));  // back off before the next try
    h = guarded_remote_actor<Handle>(sys, host, port);
  }
  return h;
}

// How a member of a job at --coordinator waits for that coordinator when it goes down:
// dials it again for --ps.failure-timeout-ms (a coordinator resumed there takes the member
// back). No --coordinator (embedded): no waiting.
reconnect_options reconnect_from(caf::actor_system& sys, const node_config& cfg);

// A server process told to stop (SIGTERM, SIGINT) while its job runs: its shard leaves the
// job, its keys and rows handed to the others (line gets "shard" and "drained"); "" then.
// Where it cannot leave, it asks the coordinator to stop the job with stop_code (as the
// coordinator's own SIGTERM or SIGINT would) and returns why.
// psctl remove-shard's request, asked again 100 ms apart for up to `patience` while the
// coordinator refuses it for now (errc::busy: another map change under way): the one-line
// summary in *done, or why it was refused or failed ("" on success).
std::string remove_shard_when_settled(caf::scoped_actor& self, const coordinator_actor& coord, std::uint32_t id,
                                      std::chrono::seconds patience, std::string* done);

std::string drain_server(caf::scoped_actor& self, const coordinator_actor& coord, const shard_actor& shard,
                         json_line& line, errc stop_code);

// What this job's checkpoints say about it (the clock is filled in per file).
checkpoint_header job_header(const node_config& cfg, const job_settings& settings, const std::string& app_name);
// The checkpoint writer, when --checkpoint-dir is given (else an empty handle).
checkpointer_actor spawn_checkpointer(caf::actor_system& sys, const node_config& cfg, const job_settings& settings,
                              const std::string& app_name, observer_actor observer);
// --restore: the newest intact checkpoint in the directory, if it fits this job; throws
// bad_request naming the file and the mismatch.
std::shared_ptr<const checkpoint> load_restore(const node_config& cfg, const job_settings& settings,
                                               const std::string& app_name);
// A job starts a fresh trace (--trace): false and *error when the file cannot be made.
bool start_trace(const node_config& cfg, std::string* error);

// A coordinator for cfg's job reporting to `observer`, with its checkpoint writer (none
// without --checkpoint-dir). Throws bad_request when the trace or --restore cannot be used.
struct running_coordinator {
  coordinator_actor coord;
  checkpointer_actor checkpointer;
  void end_checkpointer() const;  // after the job
};
running_coordinator start_coordinator(caf::actor_system& sys, const node_config& cfg, const job_settings& settings,
                                      const std::string& app_name, observer_actor observer);

// The job's verdict after the coordinator ended: workers' error results become failures,
// fewer than expected_results results too (when given); then ok, reason and code.
void conclude(job_result& res, std::optional<std::size_t> expected_results);

// Actor settings from the config.
coordinator_options coordinator_options_from(const node_config& cfg, const job_settings& settings);
shard_options shard_options_from(const node_config& cfg, std::string host);  // host "": embedded

}  // namespace ps
