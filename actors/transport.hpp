#pragma once
// The transport seam: what shards and clients ask of the path that carries large value
// blocks (and, where it can, requests) beside CAF's messages. A CAF message then holds a
// float_block that names its payload (origin, ticket) instead of the values; the receiver
// claims it. Implementations are picked by name (--ps.transport; transport_registry.cpp):
// "shm" and "tcp" (actors/data_plane.hpp: TCP connections between processes, with
// shared-memory rings on one host for "shm") and "memory" (actors/transport/memory.hpp:
// members of one process, deterministic, for the simulator and protocol tests).
//
// Why a seam: the actors' decisions do not depend on how bytes move, and a transport that
// is one file (plus its line in the registry) can be tested under the same protocol tests.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <caf/fwd.hpp>
#include <caf/message_id.hpp>
#include <caf/node_id.hpp>
#include <caf/typed_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include "actors/messages.hpp"
#include "libps/net/secret.hpp"
#include "libps/net/tcp_congestion.hpp"

namespace ps {

// What a transport moved so far (the JSON lines' data_plane_* fields).
struct transport_counters {
  std::uint64_t bytes_sent = 0, bytes_received = 0;  // payload bytes
  std::uint64_t shm_bytes_sent = 0;                  // of bytes_sent, through shared memory
  std::uint64_t messages_sent = 0, messages_received = 0;  // requests and answers carried
  std::uint64_t socket_writes = 0, writer_thread_writes = 0, reader_runs = 0, polled_reads = 0;
};

class transport {
 public:
  virtual ~transport() = default;

  // This member's identity among its peers (nonzero), and where peers reach it.
  virtual std::uint64_t token() const = 0;
  virtual const std::string& host() const = 0;
  virtual std::uint16_t port() const = 0;
  // Blocks smaller than this stay inside CAF's messages.
  virtual std::uint64_t min_bytes() const = 0;

  // Whether connect may block (then an actor connects from a thread of its own,
  // plane_connector; else it calls connect in its handler).
  virtual bool connect_blocks() const = 0;
  // Reaches the member at host:port whose token is peer (once; later calls for a connected
  // peer return true at once). False with *why on failure.
  virtual bool connect(std::uint64_t peer, const std::string& host, std::uint16_t port, std::string* why) = 0;

  // Hands the block's values to peer and returns a block that names them, or nothing when
  // the block is below min_bytes, holds no storage, or peer cannot be reached (the caller
  // then sends the values itself). The values must stay unchanged until written: `keep`
  // (or the block's storage) holds them, and is let go of once they are.
  virtual std::optional<float_block> offload(std::uint64_t peer, const float_block& block) = 0;
  // The same for values lying in several places; count is their total. Nothing, too,
  // when they are not worth moving piece by piece (in_pieces): copy them first.
  virtual std::optional<float_block> offload(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                             std::uint64_t count, std::shared_ptr<const void> keep) = 0;
  // The same under the ticket the receiver chose (a pull's seq, see expect).
  virtual std::optional<float_block> offload(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                             std::uint64_t count, std::uint64_t ticket,
                                             std::shared_ptr<const void> keep) = 0;
  // Pool buffers: n floats of unspecified contents, or a copy of n floats.
  virtual std::shared_ptr<std::vector<float>> buffer(std::size_t n) = 0;
  virtual std::shared_ptr<std::vector<float>> copied(const float* from, std::size_t n) = 0;

  // Payload `ticket` from peer lands straight in `into` (kept alive by `keep`) if its
  // size fits; its claim then gives a block without storage.
  virtual void expect(std::uint64_t peer, std::uint64_t ticket, std::vector<std::span<float>> into,
                      std::shared_ptr<const void> keep) = 0;
  // Withdraws the expectation; the memory it named is left alone from now on (waits for a
  // landing under way). Call it before that memory is used or freed.
  virtual void forget(std::uint64_t peer, std::uint64_t ticket) = 0;
  // A block with its values (waited for: for threads of their own). Throws bad_request
  // (payload_lost where asking again may help) naming the payload and what went wrong.
  virtual float_block claim(const float_block& block) = 0;
  // claim without waiting: nothing while the payload is on its way. lent_ok: the values
  // may stay in the transport's memory (the block's `lent`) for a claimer done with them
  // at once.
  virtual std::optional<float_block> try_claim(const float_block& block, bool lent_ok = false) = 0;
  // Calls ready once the block can be claimed (landed, or its sender gone).
  virtual void when_claimable(const float_block& block, std::function<void()> ready) = 0;
  // Payloads nobody expected may be lent in place (a shard's claims take them so).
  virtual void lend_ring_payloads() = 0;
  virtual std::chrono::milliseconds claim_timeout() const = 0;
  // The member whose token is origin, for errors.
  virtual std::string origin_name(std::uint64_t origin) const = 0;
  // The member whose token is origin is gone: claims of its payloads still to come fail.
  virtual void origin_gone(std::uint64_t origin, const std::string& why) = 0;

  // Requests over the transport (--ps.direct-requests): a local actor that serve()s takes
  // what peers' proxies send it (those `allowed` accepts); proxy() stands in for an actor
  // of a connected peer. Transports without messages answer false and a null proxy.
  using message_filter = std::function<bool(caf::message_id, const caf::message&)>;
  virtual bool messages_enabled() const = 0;
  virtual void serve(const caf::strong_actor_ptr& local, message_filter allowed) = 0;
  virtual caf::strong_actor_ptr proxy(std::uint64_t peer, caf::actor_id remote, const caf::node_id& node) = 0;

  // Whether this process and its peers on this host outnumber the host's CPUs now (clients
  // then keep fewer bytes in flight), and whether payloads to peer go through shared memory.
  virtual bool host_crowded() const = 0;
  virtual bool sends_by_ring(std::uint64_t peer) const = 0;
  // Whether it has peers and payloads go through shared memory to each (pushes are then
  // not cut for TCP).
  virtual bool sends_by_ring_to_all() const = 0;
  // From now on a link that ends says nothing (the process printed its status line).
  virtual void quiet() = 0;
  virtual transport_counters counters() const = 0;
};

// The block that names payload `ticket` of `count` floats from the member whose token is
// `origin` (what offload returns).
inline float_block named_payload(std::uint64_t origin, std::uint64_t ticket, std::uint64_t count) {
  float_block named;
  named.size = count;
  named.ticket = ticket;
  named.origin = origin;
  return named;
}

// Whether `count` floats in this many pieces are worth moving piece by piece (at most 64
// pieces, or 4 KiB or more each on average), rather than copied together first.
bool in_pieces(std::size_t pieces, std::uint64_t count);

// What a transport is built from (runtime/worker.cpp fills it from the flags).
struct transport_settings {
  std::string bind_host, advertised_host;  // where it listens and what it announces
  std::uint16_t port = 0;                  // 0: any free port
  std::uint64_t min_bytes = 64u << 10;
  std::chrono::milliseconds claim_timeout{10000}, stall_timeout{10000};
  std::optional<shared_secret> secret;     // peers prove it both ways before any frame
  std::size_t ring_bytes = 0;              // shared-memory rings offered (shm only)
  std::chrono::microseconds busy_poll{0};
  std::string tcp_congestion = host_tcp_congestion;
  caf::actor_system* messages_in = nullptr;  // set: requests may travel over it too
};

// The transports, by name. `between_processes`: it connects members in different
// processes (psnode's roles may use it); the others serve one process.
struct transport_kind {
  std::string name;
  bool between_processes = true;
  std::string what;  // one line for --help
  std::function<std::shared_ptr<transport>(const transport_settings&)> make;
};
const std::vector<transport_kind>& transport_kinds();
// The kind named so; throws bad_request naming the known ones.
const transport_kind& transport_kind_named(const std::string& name);

// The block's values: itself when it holds them, its encoded values decoded, or its
// payload claimed from `plane` if it has landed (nothing if not yet: ask a
// payload_claimer). Throws bad_request for encoded values that do not decode to the
// block's size, a payload that failed, or a block naming a payload without a transport.
std::optional<float_block> claim_values(transport* plane, const float_block& block, bool lent_ok = false);

using claim_atom = caf::atom_constant<caf::atom("claim")>;
using landed_atom = caf::atom_constant<caf::atom("landed")>;
using expire_atom = caf::atom_constant<caf::atom("expire")>;
using connect_atom = caf::atom_constant<caf::atom("connect")>;

// Connects for an actor when connecting blocks: spawned detached, on a thread of its own.
// Answers with the peer's token once connected, or an error saying why not.
using plane_connector_actor =
  caf::typed_actor<caf::replies_to<connect_atom, std::uint64_t, std::string, std::uint16_t>::with<std::uint64_t>>;
plane_connector_actor::behavior_type plane_connector(plane_connector_actor::pointer self,
                                                     std::shared_ptr<transport> plane);

// Claims payloads for an actor without blocking its thread: the answer comes when the
// payload has landed, its sender is gone (the error) or the claim timeout passed (the
// error). One per shard or client, linked to it.
using payload_claimer_actor = caf::typed_actor<
  caf::replies_to<claim_atom, float_block>::with<float_block>,
  // Internal: payload (origin, ticket) landed or its sender is gone.
  caf::reacts_to<landed_atom, std::uint64_t, std::uint64_t>,
  // Internal: the claim timeout of a waiting claim of (origin, ticket) passed.
  caf::reacts_to<expire_atom, std::uint64_t, std::uint64_t>>;

struct payload_claimer_state {
  struct waiting_claim {
    float_block block;
    caf::typed_response_promise<float_block> promise;
    std::chrono::steady_clock::time_point deadline;
  };
  std::multimap<std::pair<std::uint64_t, std::uint64_t>, waiting_claim> waiting;  // by (origin, ticket)
  bool lent_ok = false;  // its owner takes payloads in place (transport::try_claim)
  static inline const char* name = "payload_claimer";
};

payload_claimer_actor::behavior_type payload_claimer(
  payload_claimer_actor::stateful_pointer<payload_claimer_state> self, std::shared_ptr<transport> plane,
  bool lent_ok);

using written_atom = caf::atom_constant<caf::atom("written")>;
using drained_atom = caf::atom_constant<caf::atom("drained")>;

// Tells an actor when the payloads it offloaded straight from memory it will change (a
// shard's store) have been written, so it can wait for them with `await` before it
// changes that memory: no copy, and no thread blocked. One per shard, linked to it.
using write_tracker_actor = caf::typed_actor<
  // A payload handed over with written_signal(this) was written or dropped while the
  // tracker had a wait.
  caf::reacts_to<written_atom>,
  // Answered once `issued` payloads in all were written or dropped.
  caf::replies_to<drained_atom, std::uint64_t>::with<caf::ok_atom>>;

// What a shard, its tracker and the signals share: how many payloads are written, and
// whether the tracker waits for some. A signal tells the tracker only then: a message per
// written payload woke a scheduler thread for each pull answer (BENCHMARKS.md, "Readers
// run the actors they wake").
struct store_writes {
  std::atomic<std::uint64_t> done{0};
  std::atomic<bool> awaited{false};
};

struct write_tracker_state {
  std::multimap<std::uint64_t, caf::typed_response_promise<caf::ok_atom>> waiting;  // by issued
  static inline const char* name = "write_tracker";
};

write_tracker_actor::behavior_type write_tracker(write_tracker_actor::stateful_pointer<write_tracker_state> self,
                                                 std::shared_ptr<store_writes> writes);

// The `keep` to pass to transport::offload for values that the tracker should count: its
// release (the payload written or dropped) adds one to writes->done, and tells the tracker
// if it waits. `done` lets the owner skip the wait when every payload went out.
std::shared_ptr<const void> written_signal(const write_tracker_actor& tracker, std::shared_ptr<store_writes> writes);

}  // namespace ps
