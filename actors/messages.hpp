#pragma once
// The protocol between ActorPS actors: atoms, message types and typed actor interfaces.
// Tensors cross the wire as raw byte blocks (docs/wire-and-caf.md, "CAF 0.17 facts": CAF 0.17's per-element float
// encoding turns NaN into 1.0 and hangs on +Inf). Raw blocks assume both ends share
// endianness and float format, as every supported platform (x86-64, aarch64) does.
#include <caf/all.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "libps/persist/checkpoint.hpp"
#include "libps/core/consistency.hpp"
#include "libps/core/job_spec.hpp"
#include "libps/keys/keys.hpp"
#include "libps/rows/sparse_table.hpp"
#include "libps/core/update_loss.hpp"
#include "libps/core/update_rule.hpp"

namespace ps {

using push_atom = caf::atom_constant<caf::atom("push")>;
using data_atom = caf::atom_constant<caf::atom("data")>;
using push_rows_atom = caf::atom_constant<caf::atom("pushrows")>;
using pull_rows_atom = caf::atom_constant<caf::atom("pullrows")>;
using pull_atom = caf::atom_constant<caf::atom("pull")>;
using init_atom = caf::atom_constant<caf::atom("init")>;
using register_atom = caf::atom_constant<caf::atom("register")>;
using barrier_atom = caf::atom_constant<caf::atom("barrier")>;
using report_atom = caf::atom_constant<caf::atom("report")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using start_atom = caf::atom_constant<caf::atom("start")>;
using dispatch_atom = caf::atom_constant<caf::atom("dispatch")>;
using failed_atom = caf::atom_constant<caf::atom("failed")>;
using clock_atom = caf::atom_constant<caf::atom("clock")>;
using leave_atom = caf::atom_constant<caf::atom("leave")>;
using sweep_atom = caf::atom_constant<caf::atom("sweep")>;
using checkpoint_atom = caf::atom_constant<caf::atom("ckpt")>;
using min_clock_atom = caf::atom_constant<caf::atom("minclock")>;
using cut_atom = caf::atom_constant<caf::atom("cut")>;
using final_atom = caf::atom_constant<caf::atom("final")>;
using await_atom = caf::atom_constant<caf::atom("await")>;
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using write_atom = caf::atom_constant<caf::atom("write")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;
using news_atom = caf::atom_constant<caf::atom("news")>;
using loss_atom = caf::atom_constant<caf::atom("loss")>;
using job_failed_atom = caf::atom_constant<caf::atom("jobfailed")>;
using view_atom = caf::atom_constant<caf::atom("view")>;
using failover_atom = caf::atom_constant<caf::atom("failover")>;
using send_atom = caf::atom_constant<caf::atom("send")>;
using resend_atom = caf::atom_constant<caf::atom("resend")>;
using overdue_atom = caf::atom_constant<caf::atom("overdue")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using members_atom = caf::atom_constant<caf::atom("members")>;
using restore_atom = caf::atom_constant<caf::atom("restore")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using end_atom = caf::atom_constant<caf::atom("end")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using fill_atom = caf::atom_constant<caf::atom("fill")>;
using prefetch_atom = caf::atom_constant<caf::atom("prefetch")>;
using status_atom = caf::atom_constant<caf::atom("status")>;
using checkpoint_now_atom = caf::atom_constant<caf::atom("ckptnow")>;
using wait_report_atom = caf::atom_constant<caf::atom("waitrep")>;
using handoff_atom = caf::atom_constant<caf::atom("handoff")>;
using takeover_atom = caf::atom_constant<caf::atom("takeover")>;
using remove_shard_atom = caf::atom_constant<caf::atom("rmshard")>;
using idle_atom = caf::atom_constant<caf::atom("idle")>;
using rejoin_atom = caf::atom_constant<caf::atom("rejoin")>;
using map_change_atom = caf::atom_constant<caf::atom("mapchange")>;
using host_copy_atom = caf::atom_constant<caf::atom("hostcopy")>;
using extend_atom = caf::atom_constant<caf::atom("extend")>;

template <class Inspector>
constexpr bool is_raw_io_v =
  std::is_base_of_v<caf::data_processor<caf::serializer>, Inspector> ||
  std::is_base_of_v<caf::data_processor<caf::deserializer>, Inspector>;

// A run of floats shared between a message and its sender without copying: locally the
// storage travels by reference; on the wire it is one raw byte block, or, when the
// values went over a data connection (actors/data_plane.hpp), only their ticket, or, for a
// compressed pull answer, the codec's encoded form (libps/core/codec.hpp). claim_values()
// turns the last two into floats.
struct float_block {
  std::shared_ptr<std::vector<float>> storage;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  // Nonzero: the values are payload `ticket` of the process whose data plane has token
  // `origin`, and storage is empty until the receiver claims them.
  std::uint64_t ticket = 0;
  std::uint64_t origin = 0;
  // Set: the `size` values, encoded; storage is empty until the receiver claims them.
  std::shared_ptr<std::vector<std::byte>> encoded{};
  // Set instead of storage: the values lie in a shared-memory ring, lent to a claimer that
  // asked for that (data_plane::try_claim); the ring's writer waits for them to go back.
  std::shared_ptr<const float> lent{};

  static float_block encode_of(std::vector<std::byte> bytes, std::uint64_t values) {
    float_block b;
    b.size = values;
    b.encoded = std::make_shared<std::vector<std::byte>>(std::move(bytes));
    return b;
  }

  static float_block own(std::vector<float> v) {
    auto n = v.size();
    return {std::make_shared<std::vector<float>>(std::move(v)), 0, n};
  }
  const float* data() const { return storage ? storage->data() + offset : lent ? lent.get() + offset : nullptr; }
  // True when this block is the whole of its storage, so the storage can be taken over.
  bool whole() const { return storage && offset == 0 && size == storage->size(); }
};

// A buffer for n values that arrived inside a message (below the data plane's threshold),
// recycled when its last reference goes (contents unspecified).
std::shared_ptr<std::vector<float>> inline_values(std::size_t n);

// An encoded block's values, decoded; throws bad_request when the bytes do not hold
// exactly `size` values.
float_block decoded_values(const float_block& block);

caf::error inspect(caf::serializer& f, float_block& x);
caf::error inspect(caf::deserializer& f, float_block& x);
template <class Inspector>
std::enable_if_t<!is_raw_io_v<Inspector>, typename Inspector::result_type>
inspect(Inspector& f, float_block& x) {
  return f(caf::meta::type_name("float_block"), x.size, x.ticket);
}

// A compressed tensor chunk (libps/core/codec.hpp's encoded form), as one raw byte block.
struct encoded_block {
  std::shared_ptr<std::vector<std::byte>> bytes;
};
caf::error inspect(caf::serializer& f, encoded_block& x);
caf::error inspect(caf::deserializer& f, encoded_block& x);
template <class Inspector>
std::enable_if_t<!is_raw_io_v<Inspector>, typename Inspector::result_type>
inspect(Inspector& f, encoded_block& x) {
  std::uint64_t n = x.bytes ? x.bytes->size() : 0;
  return f(caf::meta::type_name("encoded_block"), n);
}

// A shard's snapshot (libps/persist/checkpoint.hpp) as a block, and back; decoding throws
// bad_request for a missing or damaged block.
encoded_block snapshot_block(const shard_snapshot& s);
shard_snapshot snapshot_of(const encoded_block& b);

// Key ranges of a request, as one raw block.
struct range_list {
  std::vector<key_range> ranges;
};
caf::error inspect(caf::serializer& f, range_list& x);
caf::error inspect(caf::deserializer& f, range_list& x);
template <class Inspector>
std::enable_if_t<!is_raw_io_v<Inspector>, typename Inspector::result_type>
inspect(Inspector& f, range_list& x) {
  auto n = x.ranges.size();
  return f(caf::meta::type_name("range_list"), n);
}

// Row ids of one sparse table in a request (duplicates merged by the client), as one
// raw block.
struct row_ids {
  std::uint32_t table = 0;
  std::vector<std::uint64_t> ids;
};
caf::error inspect(caf::serializer& f, row_ids& x);
caf::error inspect(caf::deserializer& f, row_ids& x);
template <class Inspector>
std::enable_if_t<!is_raw_io_v<Inspector>, typename Inspector::result_type>
inspect(Inspector& f, row_ids& x) {
  auto n = x.ids.size();
  return f(caf::meta::type_name("row_ids"), x.table, n);
}

// Carried by every state-changing request, so later stages (consistency, failover,
// duplicate suppression) can order and deduplicate them.
struct request_header {
  std::uint64_t epoch = 0;
  std::uint32_t worker = 0;
  std::uint64_t clock = 0;
  std::uint64_t seq = 0;
  // The sender's data plane token: a large reply may come over its data connection
  // (0: no data plane, replies inline).
  std::uint64_t reply_plane = 0;
  // A pull's answer encoded with this codec (codec_kind: 0 none, 1 fp16, 2 int8).
  std::uint8_t pull_codec = 0;
  // A push that also advances its worker's clock to `tick` once applied (0: none): the
  // iteration's last push to a shard carries the tick, one request fewer per iteration.
  std::uint64_t tick = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_header& x) {
  return f(caf::meta::type_name("request_header"), x.epoch, x.worker, x.clock, x.seq, x.reply_plane, x.pull_codec,
           x.tick);
}

// Floats cross as their bit patterns (CAF's float encoding is lossy, see above).
// The rule travels by its name: a rule an app registered is known by the same name in
// every process of its binary.
struct rule_msg {
  std::string kind = "sum";
  std::uint32_t lr = 0, momentum = 0, beta1 = 0, beta2 = 0, eps = 0;
  std::vector<std::uint32_t> params;  // the rule's own hyper-parameters (update_rule::params)
  static rule_msg from(const update_rule& r);
  update_rule to_rule() const;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rule_msg& x) {
  return f(caf::meta::type_name("rule_msg"), x.kind, x.lr, x.momentum, x.beta1, x.beta2, x.eps, x.params);
}

// A sparse table as the job declares it (libps/rows/sparse_table.hpp's spec on the wire;
// floats as bits, not CAF's float encoding: docs/wire-and-caf.md, "CAF 0.17 facts").
struct table_msg {
  std::string name;
  std::uint32_t dim = 0;
  std::uint32_t init_scale = 0;
  rule_msg rule;
  std::uint64_t seed = 0;
  std::uint32_t admit_after = 1;
  std::uint64_t expire_after = 0;
  static table_msg from(const sparse_table_spec& t);
  sparse_table_spec to_spec() const;  // throws bad_request for a bad spec
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, table_msg& x) {
  return f(caf::meta::type_name("table_msg"), x.name, x.dim, x.init_scale, x.rule, x.seed, x.admit_after,
           x.expire_after);
}

struct shard_entry {
  std::uint32_t id = 0;
  std::string host;  // where the shard is published; empty in embedded mode
  std::uint16_t port = 0;
  std::uint32_t pid = 0;  // process id, for operators and fault tests
  caf::actor handle;  // set in embedded mode (same process) and for replacements
  // With --replication >= 2: the chain, head (gets pushes and ticks) first, tail (answers
  // pulls) last. Empty with one copy per shard.
  std::vector<caf::actor> chain;
  // The epoch at which this entry last changed: maps may arrive out of order after two
  // failovers, and a client takes each entry from the newest map that changed it.
  std::uint64_t since_epoch = 1;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_entry& x) {
  return f(caf::meta::type_name("shard_entry"), x.id, x.host, x.port, x.pid, x.handle, x.chain, x.since_epoch);
}

// Writes checkpoint files from the shards' parts (actors/checkpointer.hpp).
using checkpointer_actor = caf::typed_actor<
  // Shard `shard`'s state at clock boundary `clock`, taken under its map of this epoch; a
  // file is written once every shard of that map has sent its part for that clock.
  caf::reacts_to<snapshot_atom, std::uint32_t, std::uint64_t, std::uint64_t, encoded_block>,
  // A newer shard map: its epoch, its shards and (after joins or removals) the owners of
  // the placed buckets (buckets, owners); later files follow it. Told before shards hand
  // keys over, so no part of a new map comes before the map.
  caf::reacts_to<view_atom, std::uint64_t, std::vector<std::uint32_t>, std::vector<std::uint64_t>,
                 std::vector<std::uint32_t>>,
  // A map change begins (true: told before any shard hands keys over) or is over (false).
  // A part cut meanwhile may lack what is still on its way to its shard (a disk tier's
  // rows take hundreds of ms): the rounds of parts that arrive meanwhile are dropped.
  caf::reacts_to<map_change_atom, bool>,
  // Answered once every complete checkpoint handed to the file writer so far is written
  // (or failed): the coordinator asks before it recovers a shard from the newest file.
  caf::replies_to<flush_atom>::with<caf::ok_atom>,
  // Answered with the file's path once the checkpoint of this clock is written (an error
  // when it could not be): the coordinator waits for the final checkpoint so.
  caf::replies_to<await_atom, std::uint64_t>::with<std::string>,
  // The path of the checkpoint of this clock when one was written already, else "".
  caf::replies_to<final_atom, std::uint64_t>::with<std::string>>;

// What every member learns from the coordinator: the shard map and the job settings.
struct cluster_view {
  std::uint64_t epoch = 1;
  std::uint32_t vnodes = 0;
  std::uint32_t bucket_bits = 0;
  std::uint32_t num_workers = 0;
  consistency_model consistency;  // BSP, SSP or ASP (its staleness bound on the wire)
  std::vector<shard_entry> shards;
  rule_msg rule;
  std::uint64_t checkpoint_every = 0;  // clocks; 0: no checkpoints
  checkpointer_actor checkpointer;     // where shards send their parts (none: no checkpoints)
  std::string checkpoint_dir;          // where shards with a disk tier save their rows (as the shard's host sees it)
  std::uint32_t replication = 1;       // copies of each shard (chain length)
  std::uint32_t job_workers = 0;       // workers the job started with (num_workers grows with joins)
  range_list dense;                    // the job's dense tensors: their buckets are placed with bounded loads
  std::vector<table_msg> tables;       // the job's sparse tables, by index
  // The dense buckets' owners after shards joined (partitioner::placement(), as two
  // columns); empty: the fresh placement of these shards.
  std::vector<std::uint64_t> placed_buckets;
  std::vector<std::uint32_t> placed_owners;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cluster_view& x) {
  return f(caf::meta::type_name("cluster_view"), x.epoch, x.vnodes, x.bucket_bits, x.num_workers,
           x.consistency.staleness, x.shards, x.rule, x.checkpoint_every, x.checkpointer, x.checkpoint_dir,
           x.replication, x.job_workers, x.dense, x.tables, x.placed_buckets, x.placed_owners);
}

// The map a view describes: its shards, ring and placement (throws bad_request).
partitioner map_of(const cluster_view& view);
// The view's placement columns from a map.
void set_placement(cluster_view& view, const partitioner& map);

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, job_setting& x) {
  return f(caf::meta::type_name("job_setting"), x.name, x.value);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tensor_spec& x) {
  return f(caf::meta::type_name("tensor_spec"), x.name, x.keys.begin, x.keys.end, x.shape);
}

// libps/core/job_spec.hpp's job_spec as it crosses the wire; job_spec::from_parts checks it.
struct job_spec_msg {
  std::uint32_t version = 0;
  std::vector<job_setting> settings;
  std::vector<tensor_spec> tensors;
  std::uint64_t fingerprint = 0;  // of the spec the coordinator holds
  static job_spec_msg from(const job_spec& s) { return {s.version, s.settings(), s.tensors(), s.fingerprint()}; }
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, job_spec_msg& x) {
  return f(caf::meta::type_name("job_spec_msg"), x.version, x.settings, x.tensors, x.fingerprint);
}

struct node_info {
  std::string role;  // "server" | "worker" | "replica"
  std::string host;
  std::uint16_t port = 0;
  std::uint32_t pid = 0;
  caf::actor handle;  // embedded mode only
  std::uint32_t shard = 0;     // role "replica": the shard it copies
  std::uint32_t position = 0;  // role "replica": its place in that shard's chain (1 = after the head)
  std::uint32_t version = protocol_version;  // the member's protocol version
  std::vector<job_setting> given;           // job settings the member was given (compared with the spec)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_info& x) {
  return f(caf::meta::type_name("node_info"), x.role, x.host, x.port, x.pid, x.handle, x.shard, x.position,
           x.version, x.given);
}

struct registration {
  std::uint32_t id = 0;  // shard id or worker id
  cluster_view view;
  encoded_block state;   // a shard's parameters from --restore (libps/persist/checkpoint.hpp); else empty
  std::uint64_t start_clock = 0;  // a worker joining a running job starts here
  job_spec_msg spec;              // the job contract (the member adopts what it was not given)
  std::uint64_t barrier_generation = 0;  // barriers released so far: a worker's next one has this number
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, registration& x) {
  return f(caf::meta::type_name("registration"), x.id, x.view, x.state, x.start_clock, x.spec,
           x.barrier_generation);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, update_loss& x) {
  return f(caf::meta::type_name("update_loss"), x.shard, x.worker, x.from_clock, x.lost_clocks, x.at_most);
}

// A worker's end: its app's one-line JSON result, or {"error": why} when it failed.
struct worker_result {
  std::uint32_t worker = 0;
  bool ok = false;
  std::string json;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_result& x) {
  return f(caf::meta::type_name("worker_result"), x.worker, x.ok, x.json);
}

// Whoever watches a job (a launcher, psnode's coordinator role, a test's inbox): the
// coordinator and the checkpoint writer tell it what happens, as it happens.
using observer_actor = caf::typed_actor<
  // A worker's progress line (epoch accuracy, clocks done).
  caf::reacts_to<report_atom, std::uint32_t, std::string>,
  // The cluster's own news, one line for operators: failovers, joins, departures,
  // checkpoints written or refused.
  caf::reacts_to<news_atom, std::string>,
  // A replacement shard's account of one worker's updates lost with the dead shard.
  caf::reacts_to<loss_atom, update_loss>,
  // A worker finished (its result) or failed (its error).
  caf::reacts_to<done_atom, worker_result>,
  // The job cannot complete (the reason); the coordinator ends it next.
  caf::reacts_to<job_failed_atom, std::string>,
  // A new shard map (a shard joined or left, a failover): where the keys are now.
  caf::reacts_to<view_atom, cluster_view>>;

using shard_actor = caf::typed_actor<
  caf::replies_to<push_atom, request_header, range_list, float_block>::with<std::uint64_t>,
  caf::replies_to<init_atom, request_header, range_list, float_block>::with<std::uint64_t>,
  // A compressed push: decoded by the shard, then applied like a plain one.
  caf::replies_to<push_atom, request_header, range_list, encoded_block>::with<std::uint64_t>,
  // Answered when the staleness controller allows a read at hdr.clock (parked till then).
  caf::replies_to<pull_atom, request_header, range_list>::with<float_block>,
  // Rows of a sparse table: gradients folded in with the table's rule (ids.size() * dim
  // values; deduplicated, deferred and ticking as a push is), and rows read (gated as a
  // pull is). Rows never touched are created from (seed, table, id).
  caf::replies_to<push_rows_atom, request_header, row_ids, float_block>::with<std::uint64_t>,
  caf::replies_to<pull_rows_atom, request_header, row_ids>::with<float_block>,
  // A worker's next rows: those on disk are read into RAM before the pull comes (a hint,
  // not answered; dropped when it does not fit the shard's map).
  caf::reacts_to<prefetch_atom, request_header, row_ids>,
  // Where this shard's process takes data connections: host, port (0: it has no data
  // plane) and the plane's token.
  caf::replies_to<data_atom>::with<std::string, std::uint16_t, std::uint64_t>,
  // Worker hdr.worker has completed hdr.clock iterations; its pushes so far were sent before.
  caf::replies_to<clock_atom, request_header>::with<std::uint64_t>,
  // From the coordinator: the worker finished or died, nobody waits for it any more.
  caf::reacts_to<leave_atom, std::uint32_t>,
  // From the coordinator: a worker joins the running job; it enters the clock vector at
  // this copy's minimum clock, which is the answer.
  caf::replies_to<join_atom, std::uint32_t>::with<std::uint64_t>,
  // From the coordinator when a shard joins: adopt this map and hand what it moves to
  // its new owners (takeover); answered with the epoch once every taker has it. Until
  // the workers get the map, requests for what moved are refused with errc::moved.
  caf::replies_to<handoff_atom, cluster_view>::with<std::uint64_t>,
  // From a giver: keys, rows, deferred pushes, clocks and applied pushes (libps/core/handoff,
  // encoded) that this shard now owns; answered with its epoch once taken.
  caf::replies_to<takeover_atom, encoded_block>::with<std::uint64_t>,
  // From the coordinator after a failover: the new shard map (epoch); acknowledged before
  // the workers get it, so no request of the new epoch reaches a shard that lacks it.
  caf::replies_to<view_atom, cluster_view>::with<std::uint64_t>,
  // From the coordinator: start a replacement for a dead shard here (registration with
  // the checkpoint's section, the checkpoint's clock, departed workers, the file's name).
  caf::replies_to<restore_atom, registration, std::uint64_t, std::vector<std::uint32_t>, std::string>::with<caf::actor>,
  // From the coordinator, when a chain is shorter than --replication after a copy died:
  // start a copy of the registration's shard in this process, at this position (it
  // waits for its seed, and does not register); answered with the copy.
  caf::replies_to<host_copy_atom, registration, std::uint32_t>::with<caf::actor>,
  // From the coordinator to the chain's tail: seed that copy with everything held here
  // (a takeover of shard_core::whole_copy) and forward every later update to it; answered
  // with the epoch once the copy took the seed. The copy joins the map after that.
  caf::replies_to<extend_atom, caf::actor>::with<std::uint64_t>,
  // From the coordinator, for time-based checkpoints: this copy's minimum clock now ...
  caf::replies_to<min_clock_atom>::with<std::uint64_t>,
  // What the shard's tables hold and its tiers did, with its process's peak memory and
  // disk reads: one JSON object (the figures of docs/sparse-tables.md).
  caf::replies_to<stats_atom>::with<std::string>,
  // Benchmarks: rows 0..count-1 of a table that the shard owns, made as first touch makes
  // them (on disk with a disk tier, else in RAM); answers how many.
  caf::replies_to<fill_atom, std::uint32_t, std::uint64_t>::with<std::uint64_t>,
  // ... and the clock boundary (above every shard's minimum) at which to send its part:
  // 0 when taken, else this copy's minimum clock, which has reached it already.
  caf::replies_to<cut_atom, std::uint64_t>::with<std::uint64_t>,
  // From the coordinator at the job's end: the highest clock a worker reached here, then
  // the part of the final checkpoint, labelled with the highest over the shards.
  caf::replies_to<final_atom>::with<std::uint64_t>,
  caf::reacts_to<final_atom, std::uint64_t>,
  // Internal: fails pulls parked for longer than the limit, naming whom they wait for.
  caf::reacts_to<sweep_atom>,
  caf::reacts_to<start_atom, std::uint16_t>,
  // From this shard's dialer (actors/reconnect.hpp) after the coordinator went down: a
  // coordinator answers at its address again (the shard rejoins it), or none did in time
  // (why; the shard ends with that error).
  caf::reacts_to<rejoin_atom, caf::actor>,
  caf::reacts_to<rejoin_atom, std::string>,
  // From the coordinator: the job ended (errc code, reason; code 0: it completed); the
  // shard acknowledges and ends with that reason, so its process exits with the job's status.
  caf::replies_to<stop_atom, std::uint8_t, std::string>::with<caf::ok_atom>>;

// A worker's key-value client, as the coordinator talks to it once it subscribed with
// (view, worker): its other messages are its own (actors/client/client_actor.cpp).
using client_actor = caf::typed_actor<
  // A new shard map (after a failover or a replacement).
  caf::reacts_to<view_atom, cluster_view>,
  // The workers still running (data partitions follow them).
  caf::reacts_to<members_atom, std::vector<std::uint32_t>>,
  // No replacement for shard `id` will come (the job ends, for this reason): its
  // requests fail now instead of at their timeout.
  caf::reacts_to<failed_atom, std::uint32_t, std::string>>;

// A registered worker, as the coordinator talks to it: the scoped actor it registered
// from, alive while the worker runs.
using worker_actor = caf::typed_actor<
  // The job ended (errc code, reason): the worker program exits with the job's status.
  caf::reacts_to<stop_atom, std::uint8_t, std::string>>;

using coordinator_actor = caf::typed_actor<
  caf::replies_to<register_atom, node_info>::with<registration>,
  // Worker w's barrier number g (counted from the registration's barrier_generation): answered
  // with g once every running worker has reached it (at once when it was released before,
  // so a barrier sent again after a coordinator restart does not wait for a second round).
  caf::replies_to<barrier_atom, std::uint32_t, std::uint64_t>::with<std::uint64_t>,
  // A member of the job comes back after the coordinator's process died and a new one
  // resumed the job (--resume): a server shard (info.shard: its id; the sender is the
  // shard) or a worker's client (info.shard: the worker's id; info.handle: the worker,
  // told when the job ends; the sender gets new maps). Refused by a coordinator that did
  // not resume this job.
  caf::replies_to<rejoin_atom, node_info>::with<registration>,
  // A worker's progress line, passed on to the observer.
  caf::reacts_to<report_atom, std::uint32_t, std::string>,
  // A worker finished or failed: it leaves the barriers and the clock vector. Acknowledged,
  // so a result sent while the coordinator was down is sent again, not lost.
  caf::replies_to<done_atom, worker_result>::with<caf::ok_atom>,
  // From a replacement shard: a worker's updates lost with the dead shard.
  caf::reacts_to<loss_atom, update_loss>,
  // From a worker's key-value client: send me every new shard map (failovers).
  caf::reacts_to<view_atom, std::uint32_t>,
  // Internal: time for a time-based checkpoint (--checkpoint-seconds).
  caf::reacts_to<checkpoint_atom>,
  // Internal: time to say which members are still missing (--ps.wait-report-ms).
  caf::reacts_to<wait_report_atom>,
  // From an operator (psctl status): members, map epoch, each shard's figures and each
  // worker's clock, as libps/observe/cluster_status.hpp's JSON.
  caf::replies_to<status_atom>::with<std::string>,
  // From an operator (psctl remove-shard ID): the shard's keys and rows go to the others
  // (a new map without it); answered with a summary once they have them, or an error
  // naming why it cannot leave. The shard stops (exit 0) once no client needs it.
  caf::replies_to<remove_shard_atom, std::uint32_t>::with<std::string>,
  // From a worker's client: it has no request left for this shard, which left the map.
  caf::reacts_to<idle_atom, std::uint32_t, std::uint32_t>,
  // From an operator (psctl checkpoint): a checkpoint at the next clock boundary; the
  // reply is that boundary. An error when the job writes no checkpoints.
  caf::replies_to<checkpoint_now_atom>::with<std::uint64_t>,
  // Ends the job with this errc (stopped, interrupted, terminated; job_failed from a
  // launcher that saw a member die) and reason: every member gets the reason and ends;
  // the reply comes before the coordinator quits.
  caf::replies_to<stop_atom, std::uint8_t, std::string>::with<caf::ok_atom>,
  // Internal: the job has ended and late registrations had their grace period: quit.
  caf::reacts_to<end_atom>,
  // Internal: a resumed job's members had their time to rejoin; the missing ones are dead.
  caf::reacts_to<rejoin_atom>>;

// Registers every type above under the same names on every node.
void register_types(caf::actor_system_config& cfg);

// ActorPS's error category (CAF category atom "ps"): the code says how a job or request
// ended, the context (one string, it survives the wire) names the peer, range or setting.
enum class errc : std::uint8_t {
  failed = 1,   // a request or an actor failed
  refused,      // a member's settings or version do not meet the job's
  job_failed,   // the job cannot complete (a shard lost, every worker gone, a timeout)
  stopped,      // stopped through the operator's command
  interrupted,  // stopped by SIGINT on the coordinator
  terminated,   // stopped by SIGTERM on the coordinator
  moved,        // the keys or rows of a request have a new owner (a newer map): send it again by it
  unsent,       // the data connection a request went on ended before its answer came: send it again through CAF
  payload_lost, // a payload an answer named never came (libps/net/bulk.hpp payload_lost): a read may ask again
  busy,         // a map change or a resume is under way: the same join or removal may be asked again later
};
caf::error make_error(errc code, std::string text);
// The errc of an ActorPS error; errc::failed for any other error.
errc code_of(const caf::error& err);
// What a program's last JSON line says and its exit status for a job that ended so
// (docs/configuration.md, "Exit status"): ok 0, failed 1, refused or busy 3, stopped 0 / 130 / 143.
const char* status_of(errc code);
int exit_status_of(errc code);

// An error carrying a human-readable text (errc::failed).
caf::error make_ps_error(std::string text);
// The text of an error: the ActorPS message if there is one, CAF's rendering otherwise.
std::string describe(const caf::error& err);

}  // namespace ps
