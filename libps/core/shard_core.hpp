#pragma once
// The decisions of one server shard as a plain state machine (the shape of etcd's raft
// library): each event (a push, a pull, a clock tick, a worker leaving or joining, a
// checkpoint boundary, a timer) changes the state, and what is left to do comes back as
// shard_effects for the caller to carry out: trace lines, pulls to answer or fail, a
// checkpoint part to send, loss reports, the fault injector's kill. It never does I/O and
// knows nothing of actors, so it is unit tested event by event (tests/test_shard_core.cpp)
// and the server_shard actor only moves messages in and effects out.
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "libps/persist/checkpoint.hpp"
#include "libps/core/consistency.hpp"
#include "libps/core/duplicate_filter.hpp"
#include "libps/core/handoff.hpp"
#include "libps/core/param_store.hpp"
#include "libps/keys/partitioner.hpp"
#include "libps/rows/row_tier.hpp"
#include "libps/rows/sparse_table.hpp"
#include "libps/core/trace.hpp"
#include "libps/core/update_loss.hpp"
#include "libps/core/update_rule.hpp"

namespace ps {

// What a request says about itself (the wire's request_header, without its transport
// fields).
struct shard_request {
  std::uint64_t epoch = 0;
  std::uint32_t worker = 0;
  std::uint64_t clock = 0;
  std::uint64_t seq = 0;
  std::uint64_t tick = 0;  // a push: then advance the worker's clock to this (0: none)
};

struct shard_config {
  std::uint32_t id = 0;
  std::string name;  // in errors and reports ("shard 3 copy 1"); empty: "shard <id>"
  std::uint64_t epoch = 1;
  std::vector<std::uint32_t> shard_ids;
  std::uint32_t vnodes = 128;
  std::uint32_t bucket_bits = 12;
  std::vector<key_range> dense;  // balanced ranges (libps/keys/partitioner.hpp)
  partitioner::placement_list placement;  // after joins: where the balanced buckets are (empty: fresh)
  update_rule rule;
  std::uint32_t num_workers = 1;
  std::uint64_t staleness = 0;
  std::uint64_t checkpoint_every = 0;      // clocks; 0: none
  bool sends_checkpoints = false;          // a checkpoint writer listens
  std::optional<std::uint64_t> kill_at;    // fault injector
  bool head = true;                        // traces pushes and sends checkpoint parts
  std::vector<stored_segment> restored;    // --restore or a checkpoint section
  std::vector<table_rows> restored_rows;   // its sparse tables' rows
  std::uint64_t restored_disk_rows = 0;    // rows its disk tier starts with (a checkpoint's)
  std::vector<std::uint64_t> restored_disk_table_rows;  // of those, per table (none: not known)
  std::vector<std::uint16_t> restored_sightings;       // row admission's counts (row_tier::sightings)
  std::vector<sparse_table_spec> tables;   // the job's sparse tables, by index
  // Bytes for the tables' rows in RAM (--shard-memory); 0: unlimited, no disk tier.
  std::uint64_t shard_memory = 0;
  eviction_policy eviction = eviction_policy::slru;
  // Bytes of evicted rows in writes under way beyond which row work waits for them to
  // land: evicting a changed row moves its bytes into a write, it frees nothing, so a
  // disk that writes slower than rows are evicted (RocksDB stalling its writes) would
  // otherwise grow the shard past its budget without bound.
  std::uint64_t write_backlog_bytes = std::uint64_t{64} << 20;
};


struct shard_effects {
  std::string error;                     // the request was refused (names this shard)
  std::vector<trace_event> traces;       // in order
  std::vector<std::uint64_t> answer;     // pull tokens to answer from the store now, in order
  std::vector<std::pair<std::uint64_t, std::string>> fail;  // pull tokens to fail, with why
  std::optional<std::uint64_t> checkpoint_at;  // send this shard's part for this clock (now)
  std::vector<update_loss> losses;       // for the coordinator (after a restore)
  std::optional<std::string> die;        // the fault injector's kill: end the process
  // The disk tier's work, in this order: evicted rows to write (then rows_written), rows
  // to read (then rows_loaded).
  std::vector<std::shared_ptr<const row_write>> writes;
  std::vector<row_key> reads;
  // Expiry's scans of the disk's rows, sent after the writes (which delete the rows
  // expiry dropped from RAM); each answer goes to rows_swept.
  std::vector<disk_sweep> sweeps;
  // A push of rows waiting for disk reads: its acknowledgment waits until it is applied
  // (applied lists it then), so a worker cannot run ahead of the disk.
  std::optional<std::uint64_t> queued_push;
  std::vector<std::uint64_t> applied;
  // A map change under a disk tier: scans that take the moved rows off the disk, sent
  // after the writes (their pages go to rows_moved, then to the rows' new owners).
  std::vector<disk_move> moves;
  // After a precopy: the moved rows whose pages went ahead, to delete from the disk
  // (row_disk::drop_moved, counted as moved) once the moves' takes are done; the change
  // does not wait for it.
  std::vector<disk_move> drops;
  bool ok() const { return error.empty(); }
};

class shard_core {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  // Throws bad_request for a configuration that cannot work (bad map, bad state).
  explicit shard_core(shard_config cfg, std::unique_ptr<param_store> store = nullptr);

  // A replacement for a dead shard: every live worker starts at the checkpoint's clock,
  // the departed ones have left; the first push of each worker reports what was lost.
  void start_as_replacement(std::uint64_t clock, const std::vector<std::uint32_t>& departed);

  // A push or an init of `n` values. A push seen before (worker, seq) is acknowledged
  // without being applied; a push of a clock the controller defers is kept (copied) and
  // applied when that clock completes. A push with r.tick then ticks (as tick() would).
  shard_effects push(const shard_request& r, const std::vector<key_range>& ranges, const float* values, std::uint64_t n);
  shard_effects init(const shard_request& r, const std::vector<key_range>& ranges, const float* values, std::uint64_t n);
  // A pull, under `token`: answered now (effects.answer holds the token) or parked until
  // the minimum clock allows it.
  shard_effects pull(const shard_request& r, std::vector<key_range> ranges, std::uint64_t token,
                     time_point now);
  // Rows of sparse table `table` by id (created on first touch), owned by this shard
  // under the map's row_owner. A push of rows folds grads (ids.size() * dim values) into
  // them with the table's rule, deduplicated, deferred and ticking as a dense push is; a
  // pull of rows is gated and parked as a dense pull is, then answered with take_row_values.
  shard_effects push_rows(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                          const float* grads, std::uint64_t n);
  shard_effects pull_rows(const shard_request& r, std::uint32_t table, std::vector<std::uint64_t> ids,
                          std::uint64_t token, time_point now);
  // Whether pull `token` is of rows, and an answered row pull's rows (read when the core
  // answered it, since the rows may leave RAM right after).
  bool is_row_pull(std::uint64_t token) const { return pulls_.at(token).table.has_value(); }
  std::vector<float> take_row_values(std::uint64_t token) { return std::move(pulls_.at(token).values); }
  // A worker says which rows it will ask for next: those on disk are read now.
  shard_effects prefetch_rows(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids);
  // The disk tier's answers to effects.reads and effects.writes. Throws bad_request for
  // an answer that does not fit what was asked.
  shard_effects rows_loaded(const std::vector<row_key>& keys, const std::vector<std::uint8_t>& found,
                            const std::vector<float>& rows, const std::vector<std::uint64_t>& pushed = {});
  // A disk sweep's answer: the listed rows that expired on disk are counted and deleted.
  shard_effects rows_swept(const disk_sweep& sweep, const swept_page& page);
  // A write landed: row work held back by the write backlog goes on.
  shard_effects rows_written(std::uint64_t seq);
  // Benchmarks: whether this shard owns row `id` of `table`; rows 0..count-1 of it that
  // this shard owns created as on first touch, in RAM (no disk tier; returns how many),
  // and the count of those the disk tier was filled with.
  bool owns_row(std::uint32_t table, std::uint64_t id) const { return map_.row_owner(table, id) == id_; }
  const partitioner& map() const { return map_; }
  std::uint64_t map_epoch() const { return map_.epoch(); }
  std::uint64_t fill_rows_in_ram(std::uint32_t table, std::uint64_t count);
  void filled_on_disk(std::uint32_t table, std::uint64_t rows) { rows_.filled_on_disk(table, rows); }
  // Rows this shard kept on its disk as a copy of a map change that moved them away,
  // deleted once the change was over: no longer counted as its own.
  void dropped_from_disk(std::uint32_t table, std::uint64_t rows) { rows_.moved_from_disk(table, rows); }
  std::size_t num_tables() const { return rows_.num_tables(); }
  // The tables' rows (RAM tier) and what the tiers did.
  const row_tier& rows() const { return rows_; }

  // The worker completed r.clock iterations (left_clock: it is done).
  shard_effects tick(const shard_request& r);
  shard_effects leave(std::uint32_t worker);
  // A worker joins: it enters the clock vector at the minimum, which is returned.
  std::uint64_t join(std::uint32_t worker);  // throws bad_request
  // The coordinator's checkpoint (time-based, or asked for): a part at this clock boundary.
  // False when the minimum clock has passed it already (no part will come for it).
  bool checkpoint_at(std::uint64_t boundary);
  // Above every clock a worker reached or pushed an update of here: the final checkpoint's
  // clock (every update below it is in).
  std::uint64_t highest_clock() const { return highest_clock_; }
  // Every worker is done: this shard's part of the final checkpoint, labelled `clock`
  // (behind reads of the disk tier still under way).
  shard_effects final_checkpoint(std::uint64_t clock);
  // Parked pulls that waited `limit` or longer fail, naming whom they wait for.
  shard_effects expire(time_point now, std::chrono::milliseconds limit);
  // When the oldest parked pull reaches `limit` (none parked: nullopt).
  std::optional<time_point> next_expiry(std::chrono::milliseconds limit) const;

  void saw_epoch(std::uint64_t epoch) { view_epoch_ = std::max(view_epoch_, epoch); }
  // The map changes under this shard: `next` (a newer epoch) gives some of its keys or
  // rows to other shards. They are taken out, one handoff per new owner (libps/core/handoff.hpp),
  // and this shard adopts `next`: later requests for them are refused as another shard's,
  // and parked pulls touching them fail now (fx.fail; their clients send them again by
  // the new map). Throws bad_request for a map that is not newer; nothing changes then.
  // With a disk tier the moved rows are not in the handoffs: the rows in RAM go to the
  // disk (fx.writes) and fx.moves take them all off it in pages (rows_moved), which must
  // reach their owners before these handoffs (whose deferred pushes may touch them).
  // Queued row work is split the same way: pulls touching moved rows fail, the moved
  // part of a queued push travels as a deferred push.
  std::vector<shard_handoff> hand_off(const partitioner& next, shard_effects& fx);
  // A page of a disk_move: its rows, one rows-only handoff per owner under this shard's
  // map. Throws bad_request for a page whose rows do not fit its ids. After a precopy
  // for this map, only the rows that changed since it began (the rest left the disk all
  // the same).
  std::vector<shard_handoff> rows_moved(const moved_page& page);
  // A map change under a disk tier, copied ahead while this shard goes on serving under
  // its map: begin_precopy(next) as the disk tier is pinned with the RAM tier's changed
  // rows written (row_tier::dirty_rows); from then on the rows `next` moves that are
  // pushed or created are noted. precopy_page turns a page of the pinned tier into
  // rows-only parts of the rows `next` moves, by owner; precopied() once every part was
  // taken, so that hand_off(next) sends only the noted rows (rows_moved), and
  // end_precopy() when it could not be (hand_off then sends them all).
  void begin_precopy(const partitioner& next);
  std::vector<shard_handoff> precopy_page(const moved_page& page) const;
  void precopied();
  void end_precopy() { precopy_.reset(); }
  // A new copy at the end of the chain seeded the same way, of every row (it is not this
  // shard's successor meanwhile: this shard acknowledges alone): begin_seed_copy() as the
  // disk tier is pinned, seed_rows of the pinned tier's pages; then, at one moment,
  // seed_changes: the rows changed since, those in RAM as seed parts at once and the
  // others as `listed` moves (keep) that copy them from the disk tier pinned again then:
  // by id, or (listed empty) by a scan of the table's pinned pages; their pages go
  // through seed_changed, then whole_copy() and end_precopy(). Throws bad_request
  // without a disk tier.
  void begin_seed_copy();
  std::vector<shard_handoff> seed_changes(std::vector<disk_move>& listed);
  std::vector<shard_handoff> seed_changed(const moved_page& page) const;
  // Takes what a handoff carries (this shard's map must give it all of it): keys, rows,
  // admission's counts (added) and deferred pushes; clocks merged (the first handoff's as they are, later ones the lower);
  // its applied (worker, seq) count as applied here. Its effects: deferred pushes and
  // parked pulls the clocks now release. A giver's part of a map change it took already
  // is ignored (a giver's head died after sending it: its new head sends it again).
  // Throws bad_request for a handoff meant for another shard or of a map newer than
  // this shard's.
  shard_effects take_over(const shard_handoff& h);
  // Everything this shard holds, as one handoff to itself (whole): what a new copy at
  // the end of its chain starts from (take_over) when the chain grows back after a copy
  // died. Nothing is taken out. With a disk tier it carries no rows: they go first, as
  // rows-only parts made by seed_rows from pages of the disk tier pinned with the RAM
  // tier's changed rows written (row_tier::dirty_rows) at the same moment.
  shard_handoff whole_copy() const;
  // A page of this shard's pinned disk tier, as a rows-only part of whole_copy. Throws
  // bad_request for a page whose rows do not fit its ids.
  shard_handoff seed_rows(const moved_page& page) const;
  // A write planned by an older map than this shard's (u.epoch below it) that touches
  // keys or rows this shard gave away: cut by the owner each has now, this shard's own
  // part under its id. Empty when it is all this shard's, or malformed (the write's own
  // checks report it then).
  std::map<std::uint32_t, deferred_update> route_stale(const deferred_update& u) const;
  // Whether every key of `ranges`, or every row `ids` of `table`, is this shard's under its
  // map (cheap: a stale write is cut, and its values copied, only when not).
  bool owns(const std::vector<key_range>& ranges) const;
  bool owns_rows(std::uint32_t table, const std::vector<std::uint64_t>& ids) const;
  // Replaces the parameters and adds the rows (a replica's state from --restore); throws
  // bad_request.
  void restore(const std::vector<stored_segment>& segments, const std::vector<table_rows>& rows = {});
  // A checkpoint's counts of rows already on its disk tier (in all and per table) and row
  // admission's counts (row_tier::restored_on_disk, restore_sightings); throws bad_request.
  void restore_counts(const std::vector<std::uint64_t>& disk_table_rows, std::uint64_t disk_rows,
                      const std::vector<std::uint16_t>& sightings);
  // The tables' rows for a checkpoint, by table and then id (a shard with a disk tier
  // holds most rows on disk: it is refused checkpoints at start).
  std::vector<table_rows> table_snapshot() const;
  void set_head(bool head) { head_ = head; }
  bool head() const { return head_; }

  // The ranges and token of a parked or just-answerable pull (valid until answered).
  const std::vector<key_range>& pull_ranges(std::uint64_t token) const;
  void forget_pull(std::uint64_t token);  // answered or failed

  std::uint32_t id() const { return id_; }
  std::uint64_t epoch() const { return view_epoch_; }
  std::uint64_t min_clock() const { return consistency_.clocks().min_clock(); }
  const vector_clock& clocks() const { return consistency_.clocks(); }
  const param_store& store() const { return *store_; }

 private:
  struct parked {
    std::uint64_t token;
    time_point since;
  };
  struct deferred_push {
    shard_request req;
    std::vector<key_range> ranges;
    std::vector<float> values;
    std::optional<std::uint32_t> table = {};  // set: a push of rows `ids` of that table
    std::vector<std::uint64_t> ids = {};
  };
  struct pending_pull {
    shard_request req;
    std::vector<key_range> ranges;
    std::optional<std::uint32_t> table = {};  // set: a pull of rows `ids` of that table
    std::vector<std::uint64_t> ids = {};
    std::vector<float> values = {};           // a row pull's answer, once read
    // The min clock that let it through the gate, traced when it is answered: a read
    // queued behind disk reads may be answered after a handoff lowered the min (the
    // giver's clocks for the keys it gained), but it reads only keys it held already.
    std::uint64_t gate_min = 0;
    // Admission: per id, 1 when not admitted (answered with its first-touch value), and
    // the admitted ids, read from the tables; both empty when every id is admitted.
    std::vector<std::uint8_t> fresh = {};
    std::vector<std::uint64_t> admitted = {};
    const std::vector<std::uint64_t>& stored_ids() const { return fresh.empty() ? ids : admitted; }
  };
  // Work on rows in arrival order, each run once its rows are in RAM; a pull of keys
  // answerable while row work is queued waits its turn, so answers leave in order.
  struct row_op {
    // checkpoint: the boundary req.clock, sent once every push before it is applied
    enum class kind : std::uint8_t { push, pull, key_pull, checkpoint } what;
    shard_request req;
    std::uint32_t table = 0;
    std::vector<std::uint64_t> ids = {};  // a push's (a pull's are in pulls_)
    std::vector<float> grads = {};
    std::uint64_t token = 0;              // a pull's
    std::uint64_t ack = 0;                // a push whose acknowledgment waits for it (0: none)
  };

  std::string check(const shard_request& r, const std::vector<key_range>& ranges) const;
  std::string departed(const shard_request& r) const;  // why a push is refused; "" when it is not
  // Checks the request, then runs body(fx); bad input either way becomes fx.error.
  template <class Body>
  shard_effects checked(const shard_request& r, const std::vector<key_range>& ranges, Body body);
  void take_push(const shard_request& r, const std::vector<key_range>& ranges, const float* values, std::uint64_t n,
                 shard_effects& fx);
  // Why a request for these rows is refused (unknown table, a row of another shard);
  // empty when it is fine.
  std::string check_rows(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids) const;
  void take_row_push(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                     const float* grads, std::uint64_t n, shard_effects& fx);
  // Parks a pull under token or answers it now.
  void gate_pull(std::uint64_t token, time_point now, shard_effects& fx);
  void advance(const shard_request& r, shard_effects& fx);
  void report_loss(const shard_request& r, shard_effects& fx);
  void release(shard_effects& fx);        // after the minimum clock may have moved
  void answer_pull(std::uint64_t token, shard_effects& fx);
  void trace_pull(const pending_pull& p, shard_effects& fx);
  // Rows pushed or pulled: done now when their rows are in RAM and nothing is queued
  // before them, else queued (their rows read from disk meanwhile).
  // acked: the push was acknowledged already (deferred under BSP), else its
  // acknowledgment waits when it is queued (fx.queued_push).
  void push_rows_now(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                     const float* grads, bool acked, shard_effects& fx);
  void push_admitted_rows(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                          const float* grads, bool acked, shard_effects& fx);
  // A pull's ids split into admitted ones and the rest (row admission).
  void sort_admitted(pending_pull& p) const;
  void read_rows(pending_pull& p);  // p.values from the tables (first-touch values for ids not admitted)
  void pull_rows_now(std::uint64_t token, shard_effects& fx);
  void run(const row_op& op, shard_effects& fx);
  // Runs the queued work whose rows are in RAM, in order, then keeps the RAM tier within
  // its budget.
  void drain_rows(shard_effects& fx);
  // Whether the queue's front row work has all its rows in RAM, asking for those it lacks.
  bool front_ready(shard_effects& fx);

  deferred_update to_update(const deferred_push& d) const;
  static deferred_push from_update(const deferred_update& u);
  bool touches_other_shards(const pending_pull& p, const partitioner& next) const;
  // A page of its disk tier's rows: its table's stride, once the rows fit its ids (else
  // throws bad_request).
  std::uint32_t page_stride(const moved_page& page) const;
  // Whether the rows a change to epoch `epoch` moves were copied ahead (every page taken).
  bool copied_ahead(std::uint64_t epoch) const {
    return precopy_ && precopy_->complete && precopy_->next && precopy_->next->epoch() == epoch;
  }
  // Rows `ids` of `table` pushed or created while a precopy runs: noted when the change
  // moves them (created: not in the pinned tier, so not sent ahead).
  void note_precopied_change(std::uint32_t table, std::span<const std::uint64_t> ids, bool created);
  // A page's rows grouped by owner under `map`, as rows-only parts (again: see shard_handoff).
  std::vector<shard_handoff> pages_by_owner(std::uint32_t table, std::uint32_t stride, const std::vector<std::uint64_t>& ids,
                                            const std::vector<float>& rows, const partitioner& map, bool again) const;
  void hand_off_rows(const partitioner& next, const std::function<shard_handoff&(std::uint32_t)>& to);
  void hand_off_deferred(const partitioner& next, const std::function<shard_handoff&(std::uint32_t)>& to);
  // After a precopy, the changed rows in RAM leave as rows-only pages (added to `pages`).
  void hand_off_tiered(const partitioner& next, const std::function<shard_handoff&(std::uint32_t)>& to,
                       shard_effects& fx, std::vector<shard_handoff>& pages);
  // Of `rows`, those a precopy noted as changed, as rows-only parts by owner under `map`.
  std::vector<shard_handoff> changed_pages(const table_rows& rows, const partitioner& map) const;
  // The rows a precopy noted as changed (less those sent from RAM), by table, ascending.
  std::map<std::uint32_t, std::vector<std::uint64_t>> changed_on_disk() const;
  // Whether `changed` rows of a table are better found by scanning it than read by id.
  bool scans_instead(std::uint32_t table, std::size_t changed) const;
  // Of `rows`, those a precopy noted as changed: [0] created since it began, [1] the others.
  std::array<table_rows, 2> split_changed(const table_rows& rows) const;
  // A handoff's rows, held here from now on (noted for a precopy under way).
  void adopt_rows(const shard_handoff& h);
  // Rows-only parts of a seed (this shard's own, as seed_rows makes them).
  std::vector<shard_handoff> seed_parts(std::array<table_rows, 2> rows) const;
  void split_row_queue(const partitioner& next, const std::function<shard_handoff&(std::uint32_t)>& to,
                       shard_effects& fx);

  std::uint32_t id_;
  std::string name_;
  partitioner map_;
  std::size_t state_slots_;  // optimizer state per dense key (the rule's)
  bool took_over_ = false;   // a handoff arrived: later ones merge clocks
  // The newest map under which this shard took keys over. A tick planned by an older map
  // may overtake the writes of its clocks that reach the keys through the giver, so it
  // does not move clocks here; the client ticks again by the new map once those writes
  // are acknowledged (kv_client's fence and catch-up).
  std::uint64_t took_over_at_ = 0;
  bool was_in_map_ = false;  // it handed off (was in an earlier map): handoffs merge clocks
  std::set<std::pair<std::uint32_t, std::uint64_t>> parts_taken_;  // (giver, epoch of its map change)
  std::unique_ptr<param_store> store_;
  staleness_controller consistency_;
  duplicate_filter applied_;
  parked_reads<parked> parked_;
  std::map<std::uint64_t, pending_pull> pulls_;  // token -> the pull, until answered or failed
  std::vector<deferred_push> deferred_;
  row_tier rows_;
  std::deque<row_op> row_queue_;
  // The queue's front while it waits for reads: its rows were kept in RAM once (rows used
  // from keep_from on are not evicted), so each read that lands checks only the rows
  // still awaited, not all of them again (a pull of 1024 rows read in 8 parts did 8 times
  // the lookups and moves in the eviction order).
  struct blocked_front {
    bool blocked = false;
    std::vector<std::uint64_t> awaited;
    std::uint64_t keep_from = UINT64_MAX;
  } front_;
  std::uint64_t next_ack_ = 0;
  std::uint64_t view_epoch_;
  std::uint64_t last_min_ = 0;
  std::uint64_t checkpoint_every_;
  bool sends_checkpoints_;
  std::set<std::uint64_t> checkpoint_at_;
  std::uint64_t highest_clock_ = 0;
  std::optional<std::uint64_t> kill_at_;
  bool head_;
  std::uint64_t write_backlog_bytes_;
  // Row work waits while the writes under way hold more than write_backlog_bytes_.
  bool writes_backed_up() const { return rows_.buffered_bytes() > write_backlog_bytes_; }
  std::optional<std::uint64_t> restored_clock_;
  std::vector<bool> loss_reported_;
  struct precopy {
    std::optional<partitioner> next;                          // the change's; none: a seed (every row)
    bool complete = false;                                    // every part was taken
    std::unordered_map<row_key, bool, row_key_hash> changed;  // moved rows changed since: created?
    // A seed's moment passed (seed_changes): later changes reach the copy as forwarded
    // updates, and the changed rows' pages, read later, must pick only those noted before.
    bool seed_cut = false;
  };
  std::optional<precopy> precopy_;
};

// Checks that every key of the ranges belongs to shard `id` under `map`; throws bad_request.
void check_ownership(const partitioner& map, std::uint32_t id, const std::vector<key_range>& ranges);

// The request checked (epoch, ownership), then `body` run; a bad_request it throws becomes
// the effects' error, named by the shard. (Here: shard_core.cpp and shard_core_data.cpp use it.)
template <class Body>
shard_effects shard_core::checked(const shard_request& r, const std::vector<key_range>& ranges, Body body) {
  shard_effects fx;
  fx.error = check(r, ranges);
  if (!fx.ok()) return fx;
  try {
    body(fx);
  } catch (const bad_request& e) {
    fx.error = name_ + ": " + e.what();
  }
  return fx;
}

}  // namespace ps
