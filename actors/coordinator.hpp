#pragma once
#include <set>
// The coordinator: members register with it; once the expected number of servers has
// registered it hands every member the shard map. It monitors every member, runs
// barriers among the live workers, and forwards progress and results to an observer.
// It quits when every worker has finished or died, which tells servers to stop.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/server_shard.hpp"
#include "libps/persist/checkpoint.hpp"
#include "libps/core/coordinator_core.hpp"
#include "libps/persist/coordinator_record.hpp"
#include "libps/core/job_spec.hpp"
#include "libps/core/update_rule.hpp"

namespace ps {

struct coordinator_options {
  std::uint32_t servers = 1;
  std::uint32_t workers = 1;
  std::uint32_t vnodes = 128;
  std::uint32_t bucket_bits = 12;
  update_rule rule;
  std::vector<sparse_table_spec> tables;  // the job's sparse tables (rows by id), by index
  // 0: BSP, k: SSP, infinite_staleness: ASP (the plain key-value store: no clocks needed).
  std::uint64_t staleness = UINT64_MAX;
  // Hears progress, news, losses, results and the job's failure (observer_actor).
  // Without one, the coordinator prints them.
  observer_actor observer;
  // Periodic checkpoints: every this many clocks the shards send their state here.
  std::uint64_t checkpoint_every = 0;
  // Or every this many seconds: at the next clock boundary above every shard's minimum.
  double checkpoint_seconds = 0;
  checkpointer_actor checkpointer;
  // Recovery of a dead shard (no replicas): the newest intact checkpoint here is loaded
  // onto a replacement shard in this process. Empty: a dead shard ends the job.
  std::string checkpoint_dir;
  // A recovery reads the checkpoint on a thread of its own; true: on the actor system's
  // scheduler (tests on the deterministic scheduler, where no other thread may answer).
  bool checkpoint_reads_on_scheduler = false;
  shard_options replacement;  // options of replacement shards
  // While members are missing: how often to say which are there and which are awaited (0:
  // never; psnode's --ps.wait-report-ms gives 5 s). The timer holds the coordinator alive.
  std::chrono::milliseconds wait_report{0};
  // Copies of each shard (chain replication; 1: none).
  std::uint32_t replication = 1;
  // --restore: the shards start from this checkpoint's parameters.
  std::shared_ptr<const checkpoint> restore;
  // With restore: the clock the workers start at (the checkpoint's, when the app resumes
  // there; 0: the job runs again from its start on the restored state).
  std::uint64_t restore_clock = 0;
  // The job contract: handed to every member; a member whose given settings or protocol
  // version differ is refused (before the job has formed, that fails the job).
  job_spec spec;
  // --state-dir: what a resume needs (libps/persist/coordinator_record.hpp) is saved here as it
  // changes, once the job has formed. Empty: nothing is saved.
  std::string state_dir;
  // --resume: the job this coordinator takes over from a dead one (its saved state); its
  // members have rejoin_patience to come back, after which the missing ones count as dead.
  std::shared_ptr<const coordinator_record> resume;
  std::chrono::milliseconds rejoin_patience{10000};
};

// One round of a map change's handoffs: each shard in `pending` (by id) is asked, through
// its head of the moment, to adopt the change's map and hand over what it moves. With
// chains, a head that dies first is asked again through the chain's new head, which
// kept what the change moved when it adopted the change as a copy (shard_state::kept).
struct handover_round {
  std::uint64_t epoch = 0;                         // the change's map
  std::map<std::uint32_t, std::uint64_t> pending;  // shard id -> its latest ask
  std::string failed;                              // why a shard could not (empty: none)
  std::function<void(std::string)> done;           // once every shard answered
};

struct coordinator_state {
  std::vector<shard_entry> shards;
  std::vector<shard_actor> shard_handles;  // each shard's head
  // Registrations parked until the map (servers) or the chains too (workers) are complete.
  struct parked_registration {
    caf::typed_response_promise<registration> promise;
    std::uint32_t id = 0;
    bool server = false;
  };
  std::vector<parked_registration> waiting;
  // The job's phase, members, barrier and results: its decisions (libps/core/coordinator_core).
  coordinator_core core;
  // The workers parked at the barrier (the core knows which), by worker.
  std::map<std::uint32_t, caf::typed_response_promise<std::uint64_t>> barrier;
  // A resumed job waits for its members to come back (rejoin): per shard, the copies (by
  // the place they were started at, as in the record's chains) not back yet, and those back.
  std::map<std::uint32_t, std::set<std::uint32_t>> absent_copies;
  std::map<std::uint32_t, std::map<std::uint32_t, caf::actor>> rejoined_copies;
  std::map<caf::actor_addr, std::string> members;  // monitored address -> description
  std::map<caf::actor_addr, std::uint32_t> worker_ids;
  std::vector<worker_actor> worker_handles;  // the registered workers: told when the job ends
  caf::error end_reason;                   // why it ended (none: completed)
  std::uint64_t epoch = 1;
  std::map<caf::actor_addr, std::uint32_t> shard_ids;  // every copy of a shard (heads, replicas) -> its id
  std::map<caf::actor_addr, std::uint32_t> copy_positions;  // a replica -> where it was started (others: 0)
  std::vector<shard_actor> copies;                     // every copy: told views and departures
  // Chains grow back after a copy died: per server process of the job's start (by its
  // shard's id), the shard it was started with, while it lives. Copy j of shard s lives
  // in process (s + j) % servers, grown ones too (their position says where).
  std::map<std::uint32_t, shard_actor> process_heads;
  bool growing = false;  // a chain is growing by a copy (one at a time)
  std::uint64_t growth_attempt = 0;  // numbers growth steps: a late answer to one given up on is ignored
  caf::actor_addr growth_tail;       // the tail seeding the copy of the growth under way
  std::function<void(std::string)> growth_abort;  // gives that growth up (its tail died)
  std::function<void()> after_growth;  // a map change that waits for that copy to join its chain
  std::set<std::uint32_t> ungrowable;  // shards whose tail refused to seed a copy (a disk tier)
  // A leaver's copies further down its chain: stopped with it once clients drained it.
  std::map<std::uint32_t, std::vector<caf::actor>> leavers_copies;
  std::vector<client_actor> view_subscribers;      // workers' key-value clients
  partitioner::placement_list placement;           // after joins: the dense buckets' owners (empty: fresh)
  bool joining = false;  // a shard is joining or leaving: keys are being handed over
  std::shared_ptr<handover_round> handover;  // the change's handoffs under way (none: none)
  std::function<void()> retry_move;  // a map change that waits for a chain to close over a dead head
  std::string change;    // that map change, saved for a resume: "join" or "leave" (empty: none)
  std::uint32_t change_shard = 0;
  std::uint64_t change_epoch = 0;  // that change's map's epoch
  std::set<std::uint32_t> retired;  // shards removed from the map (psctl remove-shard); ids are not reused
  // A shard that left the map stops once every running worker's client has no request
  // left for it: per such shard, the workers still to say so.
  std::map<std::uint32_t, std::set<std::uint32_t>> draining_clients;
  std::set<std::uint32_t> leavers_held;  // drained, but their processes hold copies not yet re-homed (stop_if_drained)
  std::map<caf::actor_addr, std::uint32_t> subscriber_workers;  // a client -> its worker
  static inline const char* name = "coordinator";
};

coordinator_actor::behavior_type coordinator(coordinator_actor::stateful_pointer<coordinator_state> self,
                                             coordinator_options opts);

}  // namespace ps
