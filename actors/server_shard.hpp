#pragma once
// A server shard: owns the key buckets the partitioner gives it, folds pushes into its
// parameters with the job's update rule and answers pulls. It learns its id and the
// shard map by registering with the coordinator when told its published port (start).
// The decisions are libps/core/shard_core's; this actor moves messages in and effects out,
// and owns what only an actor can: promises, the chain's forwards, the data plane, files.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "actors/transport.hpp"
#include "actors/write_batch.hpp"
#include "actors/messages.hpp"
#include "actors/reconnect.hpp"
#include "libps/core/handoff.hpp"
#include "actors/row_io.hpp"
#include "libps/persist/checkpoint.hpp"
#include "libps/sim/faults.hpp"
#include "libps/core/shard_core.hpp"

namespace ps {

struct shard_options {
  std::string host;  // where the shard is reachable (empty: embedded)
  std::chrono::milliseconds register_timeout{60000};
  std::chrono::milliseconds reply_delay{0};  // fault hook for tests: answer late
  // A pull parked by the staleness controller longer than this fails with an error that
  // names the worker everybody waits for (keep it below the client's request timeout).
  std::chrono::milliseconds park_limit{27000};
  std::string trace_path;  // non-empty: append consistency trace lines here (libps/core/trace.hpp)
  // The fault injector's plan: the shard kills its own process at its kill clock. Empty:
  // the job's (the job spec's "faults", which the coordinator's --faults set).
  fault_plan faults;
  // A replacement for a dead shard (set by the coordinator): configured at once from
  // this registration and state, no registration round.
  struct replacement {
    registration reg;                     // with the checkpoint's section as its state
    std::uint64_t clock = 0;             // the checkpoint's clock: every live worker starts there
    std::vector<std::uint32_t> departed;  // workers that finished or died before
    std::string source;                  // the checkpoint file, for reports
  };
  std::shared_ptr<const replacement> replaces;
  // A copy of another shard further down its chain (--replication >= 2), spawned by that
  // shard's successor process; configured from this registration, then it registers as
  // a replica so the coordinator can build the chain.
  struct replica_role {
    registration reg;
    std::uint32_t position = 1;
    // Under --restore of rows on a disk tier: the copy's own shard's rows in the same
    // checkpoint, to start its disk tier from (empty: none).
    std::string disk_seed;
    // A copy a chain grew back with: seeded by the tail (takeover), never registers.
    bool seeded_by_tail = false;
  };
  std::shared_ptr<const replica_role> replica;
  // How long a copy waits for its successor in the chain to acknowledge.
  std::chrono::milliseconds forward_timeout{30000};
  // The job settings this server was given (the coordinator refuses it when they differ
  // from the job's).
  std::vector<job_setting> given;
  // This process's data plane (large pushes arrive and large pulls leave through it);
  // none: every block travels inside CAF's messages.
  std::shared_ptr<transport> plane;
  // The sparse tables' RAM budget (--shard-memory; 0: all in RAM, no disk tier), where
  // the disk tier lives (--shard-dir) and what leaves RAM first (--eviction).
  std::uint64_t shard_memory = 0;
  std::string shard_dir = "/var/tmp";
  eviction_policy eviction = eviction_policy::slru;
  // How the disk tier's I/O runs (on threads of its own, pages of 16,384 rows; the
  // simulation's: on its scheduler, pages of 2 rows).
  row_io_settings disk_io;
  // A map change copies the moved rows of a disk tier ahead of its cut (--handoff).
  bool copy_ahead = true;
  // Whether and how long the shard waits for a coordinator that went down to come back
  // (resumed at its address); no dial: it ends at once.
  reconnect_options reconnect;
  // Dials another shard's published address (blocking; run on a thread of its own). The
  // handles a map carries reach other shards through the coordinator's node, which told of
  // them; once that node is gone (a coordinator restarted with --resume) they reach
  // nothing, so the shard dials its peers directly and sends to the handle the dial gives
  // (null: it could not connect). None (embedded shards): never needed.
  std::function<shard_actor(const std::string&, std::uint16_t)> dial_shard{};
};

struct shard_state {
  std::optional<shard_core> core;
  coordinator_actor coordinator;  // the one it registered with, or the one it rejoined after a restart
  std::string coordinator_lost;   // non-empty while the coordinator is away: why it went down
  std::uint16_t port = 0;         // where it is published (a rejoin says so)  // the decisions; set once the shard knows its map
  std::string name = "shard ?";    // for error messages ("shard 3", "shard 3 copy 1")
  bool dies_in_handoff = false;    // the fault plan kills this shard's process in its first map change
  // Pulls the core has under a token, with what only the actor knows of them.
  struct waiting_pull {
    request_header hdr;
    caf::typed_response_promise<float_block> promise;
  };
  std::map<std::uint64_t, waiting_pull> pulls;
  std::uint64_t next_pull = 0;
  bool sweep_scheduled = false;
  checkpointer_actor checkpointer;
  std::string checkpoint_dir;     // where rows on a disk tier are saved for a checkpoint
  payload_claimer_actor claimer;  // with a data plane: claims pushed payloads without blocking
  write_tracker_actor writes;     // with a data plane: says when answers written from the store are out
  row_io_actor disk;              // with --shard-memory: the tables' disk tier
  // Pushes of rows waiting for disk reads, by the core's id: their replies, sent once applied.
  std::map<std::uint64_t, std::function<void()>> push_waiters;
  std::uint64_t writes_issued = 0;
  std::uint64_t writes_awaited = 0;
  std::shared_ptr<store_writes> write_counts = std::make_shared<store_writes>();
  int trace_fd = -1;
  std::uint64_t trace_copy = 0;  // this copy in the trace: its process id and actor id
  // Requests received, for the operator's status (psctl status): pushes (dense and rows)
  // and pulls (dense and rows) since the shard started.
  std::uint64_t pushes_received = 0, pulls_received = 0;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  // Chain replication: this copy's successor (none: it is the tail, it acknowledges) and
  // the updates passed to it and not yet acknowledged, in order, with the reply owed.
  shard_actor successor;
  bool successor_down = false;
  // The successor is a copy this tail seeded as its chain grew back (extend), which the
  // coordinator's maps do not name yet: a map naming none keeps it, its death drops it.
  bool successor_unannounced = false;
  // That copy is being seeded from a disk tier, page by page: updates applied here wait
  // (in forwards, unsent) until the seed's last part has gone.
  bool seeding_copy = false;
  // Before that, a copy seeded from the disk tier's pinned pages while this tail still
  // acknowledges alone (extend_chain): the copy is not its successor yet.
  shard_actor seeding_ahead;
  // The epoch of the newest view whose heads and chains this copy took (take_view).
  std::uint64_t placed_epoch = 0;
  // The other shards' heads, by id, where the map names them (a joined shard): writes
  // planned by an older map go on to the keys' new owners.
  std::map<std::uint32_t, shard_actor> owners;
  // Where the map says each of them is published (host, port; empty host: embedded), and
  // how to dial one (shard_options::dial_shard).
  std::map<std::uint32_t, std::pair<std::string, std::uint16_t>> owner_addresses;
  std::function<shard_actor(const std::string&, std::uint16_t)> dial_shard;
  // While this shard's handoff still has parts to send (a disk tier's pages go first),
  // writes of moved keys it passes on wait here, so none reaches a new owner before the
  // keys and rows it updates (CAF keeps one sender's order): sent once the parts are.
  bool holding_forwards = false;
  // The handoff under way (its answer waits for its parts to be taken): a resumed
  // coordinator that asks again for the same map is answered with it.
  std::shared_ptr<void> handoff;
  // With a disk tier, the rows a map change moves are copied to their new owners ahead of
  // the cut, while this head serves on (copy_ahead): the copy under way, and the newest
  // epoch copied ahead (or tried: the cut then sends what did not get there).
  std::shared_ptr<void> precopy;
  std::uint64_t precopied_epoch = 0;
  // A copy's share of its head's handoff: what the map change moved away from it, kept
  // until the next change, to be handed over should this copy become the head first. With
  // a disk tier, the moved rows stay on its disk (hand_off's moves, not scanned yet): taken
  // off then, else deleted once the change is over (forget_kept), so no later change's
  // scan hands them over again.
  struct kept_change {
    std::vector<shard_handoff> parts;
    std::vector<disk_move> moves;
    bool empty() const { return parts.empty() && moves.empty(); }
  };
  kept_change kept;
  std::vector<std::function<void()>> held_forwards;
  // Handoff parts and writes of moved keys on their way to other shards' heads, until
  // answered: sent again should a map name another head for the owner.
  struct owner_send {
    std::uint32_t owner = 0;
    shard_actor sent_to;
    std::function<void()> send;
    bool redialed = false;  // sent again over a direct connection to the owner after a failure
  };
  std::map<std::uint64_t, owner_send> owner_sends;
  std::uint64_t next_owner_send = 0;
  struct forward {
    std::function<void(shard_actor, std::uint64_t)> send;  // (successor, tag)
    caf::typed_response_promise<std::uint64_t> reply;
    std::uint64_t value;
    // Instead of the reply: called with the outcome (a part of a write planned by an
    // older map, acknowledged once every part is).
    std::function<void(caf::error)> done = {};
    void settle(caf::error err) {
      if (done) return done(std::move(err));
      if (err) reply.deliver(std::move(err));
      else reply.deliver(value);
    }
  };
  std::map<std::uint64_t, forward> forwards;
  std::uint64_t next_forward = 0;
  ~shard_state();
  void trace(const trace_event& e) const;
};

// The shard's answers to a burst of requests leave in one write per connection
// (write_batch).
using shard_impl = batched_writes<caf::stateful_actor<shard_state, shard_actor::base>>;

shard_actor::behavior_type server_shard(shard_impl* self, coordinator_actor coordinator, shard_options opts);

}  // namespace ps
