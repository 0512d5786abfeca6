#pragma once
// The coordinator's decisions about the job as a whole, as a plain state machine (the
// shape of shard_core): its phase, who has registered, which workers run, the barrier and
// the job's end. Each event (a server, copy or worker registers, a worker arrives at the
// barrier or finishes, the job ends or is stopped, a resumed job's members come back)
// changes the state; what is left to do comes back as job_effects for the coordinator
// actor to carry out with its handles and promises. No I/O and no actors: it is unit
// tested event by event (tests/test_coordinator_core.cpp).
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "libps/persist/coordinator_record.hpp"

namespace ps {

// The job's phase, one at a time:
//   forming   members register; the map is not out (not every server is in)
//   chaining  the map is out to the servers; copies further down the chains register
//   running   the map and every chain are complete (workers may still register)
//   resuming  a restarted coordinator waits for the dead one's members to come back
//   stopping  an operator's stop: a last checkpoint is being cut before the end
//   ending    the end has begun (members are told; the coordinator quits after)
enum class job_phase : std::uint8_t { forming, chaining, running, resuming, stopping, ending };
const char* to_string(job_phase p);

// What an event leaves to do, in this order: save the record, deliver a released
// barrier, tell the shards' copies that workers left the clock vector, tell the clients
// the running workers, then either finish the job, fail it, or see whether a resume is
// complete.
struct job_effects {
  bool persist = false;
  std::optional<std::uint64_t> released;  // the barrier generation released ...
  std::vector<std::uint32_t> release_to;  // ... to these workers, in order
  std::vector<std::uint32_t> left;        // workers that left the clock vector
  bool members_changed = false;
  bool finish = false;                    // every worker is done, at least one with a result
  std::string fail;                       // the job fails with this reason
  bool check_resume = false;              // resuming: the members may all be back now
};

// A worker's barrier: answered now (with a generation), refused (why), failed with the
// job's end, or parked until every running worker is there.
struct barrier_answer {
  enum kind_t { now, refused, ended, parked } kind = parked;
  std::uint64_t generation = 0;
  std::string why;
};

// What an operator's stop does: end the job at once, wait for the stop already under
// way, or cut a last checkpoint first.
enum class stop_plan : std::uint8_t { end_now, already_stopping, checkpoint_first };

class coordinator_core {
 public:
  coordinator_core(std::uint32_t servers = 0, std::uint32_t workers = 0, std::uint32_t replication = 1);

  job_phase phase() const { return phase_; }
  bool map_out() const { return phase_ != job_phase::forming && phase_ != job_phase::ending; }
  // The map and chains are complete, and the job neither resumes nor ends.
  bool formed() const { return phase_ == job_phase::running || phase_ == job_phase::stopping; }
  // The map and chains are complete, or were when the job's members left (resuming).
  bool chains_complete() const { return formed() || phase_ == job_phase::resuming; }
  bool resuming() const { return phase_ == job_phase::resuming; }
  bool ending() const { return phase_ == job_phase::ending; }
  // Every expected server and worker of the job's start has registered.
  bool all_registered() const { return servers_in_ >= servers_ && next_worker_ >= workers_; }
  std::uint32_t workers_registered() const { return next_worker_; }

  // ---- registration
  // The next server's shard id; none when every server of the job's start is in.
  std::optional<std::uint32_t> admit_server();
  // The next worker's id; none when every worker of the job's start is in.
  std::optional<std::uint32_t> admit_worker();
  // A worker that joins the running job: a new id beyond the job's start.
  std::uint32_t add_worker();
  // After a server or worker was parked: true when every server is in, so the parked
  // registrations get the map (the first time, the job leaves `forming`).
  bool map_complete();
  // Whether a copy may register now (chains are being built).
  bool accepts_copy() const { return replication_ >= 2 && phase_ == job_phase::chaining; }
  // A copy registered: true when it completed every chain (the job runs).
  bool copy_registered();

  // ---- the job's progress
  bool worker_running(std::uint32_t w) const { return w < done_.size() && !done_[w]; }
  const std::vector<bool>& worker_done() const { return done_; }
  std::uint32_t running_workers() const { return static_cast<std::uint32_t>(done_.size()) - finished_; }
  std::vector<std::uint32_t> running_ids() const;
  std::vector<std::uint32_t> finished_ids() const;  // done or dead
  std::uint64_t barrier_generation() const { return generation_; }
  const std::map<std::uint32_t, coordinator_record::result>& results() const { return results_; }
  // The coordinator may save its record now (formed, every member of the start in).
  bool may_persist() const { return formed() && next_worker_ >= workers_; }

  barrier_answer enter_barrier(std::uint32_t worker, std::uint64_t generation, job_effects& fx);
  // A worker's end with its result: false when it is not running (a duplicate after a
  // restart changes nothing).
  bool record_result(std::uint32_t worker, bool ok, const std::string& json);
  // A worker is done (its end, its death, or it never came back): it leaves.
  job_effects worker_finished(std::uint32_t worker);
  // After a worker left or the members came back: the job ends once every worker is
  // done, else the barrier may be complete now.
  job_effects go_on();

  // ---- the end
  // The end begins: false when it already has. The workers parked at the barrier are
  // handed back (they get the job's end).
  bool begin_end(std::vector<std::uint32_t>& parked);
  stop_plan begin_stop(bool failure, bool has_checkpointer);

  // ---- a resumed job
  void resume_from(const coordinator_record& r);
  const std::set<std::uint32_t>& absent_workers() const { return absent_; }
  // A worker of the dead coordinator's job is back: false when it was not awaited.
  bool worker_back(std::uint32_t w) { return absent_.erase(w) > 0; }
  // The rejoin deadline: the workers still away, no longer awaited (each then finishes).
  std::vector<std::uint32_t> give_up_absent();
  // Every member is back (or given up): the job runs again.
  void resumed();

 private:
  job_effects release_if_complete();

  std::uint32_t servers_, workers_, replication_;
  job_phase phase_ = job_phase::forming;
  std::uint32_t servers_in_ = 0;
  std::uint32_t copies_in_ = 0;
  std::uint32_t next_worker_ = 0;
  std::vector<bool> done_;   // by worker id: the job's start plus those that joined
  std::uint32_t finished_ = 0;  // done or dead
  std::set<std::uint32_t> barrier_;  // workers at the barrier
  std::uint64_t generation_ = 0;     // barriers released so far
  std::map<std::uint32_t, coordinator_record::result> results_;
  std::set<std::uint32_t> absent_;  // resuming: workers not back yet
};

}  // namespace ps
