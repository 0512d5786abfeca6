// The coordinator's decisions about the job without actors (libps/core/coordinator_core.hpp):
// event in, effects out, duplicates and late events included.
#include <doctest/doctest.h>

#include "libps/core/coordinator_core.hpp"

using namespace ps;

namespace {

// A job of 2 servers and 2 workers whose map is out (no chains): every member registered.
coordinator_core running_job(std::uint32_t workers = 2) {
  coordinator_core core(2, workers, 1);
  core.admit_server();
  core.admit_server();
  for (std::uint32_t w = 0; w < workers; ++w) core.admit_worker();
  REQUIRE(core.map_complete());
  REQUIRE(core.phase() == job_phase::running);
  return core;
}

}  // namespace

TEST_CASE("coordinator_core: servers and workers get ids in order; the map goes out once every server is in") {
  coordinator_core core(2, 1, 1);
  CHECK(core.phase() == job_phase::forming);
  CHECK(core.admit_worker() == 0u);
  CHECK_FALSE(core.map_complete());  // a worker parks until the servers are in
  CHECK(core.admit_server() == 0u);
  CHECK_FALSE(core.map_complete());
  CHECK(core.admit_server() == 1u);
  CHECK_FALSE(core.admit_server());  // a third server of a job of 2 joins instead
  CHECK_FALSE(core.admit_worker());
  CHECK(core.map_complete());
  CHECK(core.phase() == job_phase::running);
  CHECK(core.all_registered());
  CHECK(core.map_complete());  // asked again (a later park): still complete, same phase
  CHECK(core.phase() == job_phase::running);
}

TEST_CASE("coordinator_core: with chains the job runs once every copy registered; a copy outside chaining is refused") {
  coordinator_core core(2, 1, 3);
  CHECK_FALSE(core.accepts_copy());  // no map out yet
  core.admit_server();
  core.admit_server();
  REQUIRE(core.map_complete());
  CHECK(core.phase() == job_phase::chaining);
  CHECK(core.map_out());
  CHECK_FALSE(core.chains_complete());
  CHECK(core.accepts_copy());
  for (int i = 0; i < 3; ++i) CHECK_FALSE(core.copy_registered());
  CHECK(core.copy_registered());  // 2 shards x 2 further copies
  CHECK(core.phase() == job_phase::running);
  CHECK_FALSE(core.accepts_copy());
  CHECK_FALSE(coordinator_core(1, 1, 1).accepts_copy());  // no chains at all
}

TEST_CASE("coordinator_core: the barrier is released once every running worker is there, saved before delivery") {
  auto core = running_job(3);
  job_effects fx;
  CHECK(core.enter_barrier(0, 0, fx).kind == barrier_answer::parked);
  CHECK_FALSE(fx.released);
  CHECK(core.enter_barrier(2, 0, fx).kind == barrier_answer::parked);
  CHECK_FALSE(fx.released);
  CHECK(core.enter_barrier(0, 0, fx).kind == barrier_answer::parked);  // sent again: still one arrival
  CHECK_FALSE(fx.released);
  CHECK(core.enter_barrier(1, 0, fx).kind == barrier_answer::parked);
  REQUIRE(fx.released);
  CHECK(*fx.released == 0u);
  CHECK(fx.persist);
  CHECK(fx.release_to == std::vector<std::uint32_t>{0, 1, 2});
  CHECK(core.barrier_generation() == 1u);
  // A barrier sent again after the release (a coordinator restarted under it) is answered at once.
  auto late = core.enter_barrier(1, 0, fx);
  CHECK(late.kind == barrier_answer::now);
  CHECK(late.generation == 0u);
}

TEST_CASE("coordinator_core: a worker that is not running has no barrier") {
  auto core = running_job();
  job_effects fx;
  auto unknown = core.enter_barrier(7, 0, fx);
  CHECK(unknown.kind == barrier_answer::refused);
  CHECK(unknown.why == "coordinator: worker 7 is not running, it has no barrier");
  core.worker_finished(1);
  CHECK(core.enter_barrier(1, 0, fx).kind == barrier_answer::refused);
}

TEST_CASE("coordinator_core: a worker's end releases a barrier the others wait at; a duplicate end changes nothing") {
  auto core = running_job(3);
  job_effects fx;
  core.enter_barrier(0, 0, fx);
  core.enter_barrier(1, 0, fx);
  CHECK(core.record_result(2, true, "{}"));
  fx = core.worker_finished(2);
  CHECK(fx.left == std::vector<std::uint32_t>{2});
  CHECK(fx.members_changed);
  CHECK(fx.persist);
  REQUIRE(fx.released);
  CHECK(fx.release_to == std::vector<std::uint32_t>{0, 1});
  CHECK(core.running_ids() == std::vector<std::uint32_t>{0, 1});
  CHECK(core.finished_ids() == std::vector<std::uint32_t>{2});
  CHECK_FALSE(core.record_result(2, true, "{}"));  // sent again after a restart
  auto again = core.worker_finished(2);
  CHECK(again.left.empty());
  CHECK_FALSE(again.persist);
}

TEST_CASE("coordinator_core: the job finishes when every worker is done, and fails when none left a result") {
  auto done = running_job();
  CHECK(done.record_result(0, true, "{\"w\":0}"));
  CHECK_FALSE(done.worker_finished(0).finish);
  auto fx = done.worker_finished(1);  // died: no result of its own
  CHECK(fx.finish);
  CHECK(fx.fail.empty());
  CHECK(done.results().at(0).json == "{\"w\":0}");

  auto lost = running_job();
  lost.worker_finished(0);
  fx = lost.worker_finished(1);
  CHECK_FALSE(fx.finish);
  CHECK(fx.fail == "every worker went down before finishing");
}

TEST_CASE("coordinator_core: a worker that joins the running job gets the next id and counts for the barrier") {
  auto core = running_job();
  CHECK(core.add_worker() == 2u);
  CHECK(core.running_workers() == 3u);
  job_effects fx;
  core.enter_barrier(0, 0, fx);
  core.enter_barrier(1, 0, fx);
  CHECK_FALSE(fx.released);  // the joiner is not there yet
  core.enter_barrier(2, 0, fx);
  CHECK(fx.released);
}

TEST_CASE("coordinator_core: the end hands back the parked workers once; later barriers get the end") {
  auto core = running_job();
  job_effects fx;
  core.enter_barrier(1, 0, fx);
  std::vector<std::uint32_t> parked;
  CHECK(core.begin_end(parked));
  CHECK(parked == std::vector<std::uint32_t>{1});
  CHECK(core.phase() == job_phase::ending);
  CHECK_FALSE(core.begin_end(parked));  // a second end (a stop racing a failure) does nothing
  CHECK(core.enter_barrier(0, 0, fx).kind == barrier_answer::ended);
  CHECK_FALSE(core.may_persist());
}

TEST_CASE("coordinator_core: a stop cuts a checkpoint first only in a formed job with a writer") {
  coordinator_core forming(1, 1, 1);
  CHECK(forming.begin_stop(false, true) == stop_plan::end_now);
  auto no_writer = running_job();
  CHECK(no_writer.begin_stop(false, false) == stop_plan::end_now);
  auto core = running_job();
  CHECK(core.begin_stop(true, true) == stop_plan::end_now);  // a failure never waits
  CHECK(core.begin_stop(false, true) == stop_plan::checkpoint_first);
  CHECK(core.phase() == job_phase::stopping);
  CHECK(core.formed());  // checkpoints and the record go on while it stops
  CHECK(core.begin_stop(false, true) == stop_plan::already_stopping);
  CHECK(core.begin_stop(true, true) == stop_plan::end_now);
}

TEST_CASE("coordinator_core: the record is saved only once the job formed with every worker of its start") {
  coordinator_core core(1, 2, 1);
  core.admit_server();
  core.admit_worker();
  core.map_complete();
  CHECK_FALSE(core.may_persist());  // worker 1 has not registered
  core.admit_worker();
  CHECK(core.may_persist());
}

TEST_CASE("coordinator_core: a resumed job waits for its workers, holds the barrier, and gives the absent up") {
  coordinator_record r;
  r.servers = 2;
  r.workers = 3;
  r.shards.resize(2);
  r.worker_done = {false, true, false};
  r.results[1] = {true, "{}"};
  r.barrier_generation = 4;
  coordinator_core core(2, 3, 1);
  core.resume_from(r);
  CHECK(core.phase() == job_phase::resuming);
  CHECK(core.absent_workers() == std::set<std::uint32_t>{0, 2});
  CHECK_FALSE(core.admit_server());  // the map is the record's
  CHECK_FALSE(core.may_persist());
  job_effects fx;
  CHECK(core.enter_barrier(0, 3, fx).kind == barrier_answer::now);  // released before the restart
  CHECK(core.enter_barrier(0, 4, fx).kind == barrier_answer::parked);
  CHECK(core.enter_barrier(2, 4, fx).kind == barrier_answer::parked);
  CHECK_FALSE(fx.released);  // not while resuming
  CHECK(core.worker_back(0));
  CHECK_FALSE(core.worker_back(0));  // a second rejoin is not awaited
  CHECK(core.give_up_absent() == std::vector<std::uint32_t>{2});
  fx = core.worker_finished(2);
  CHECK(fx.check_resume);
  CHECK_FALSE(fx.released);
  core.resumed();
  CHECK(core.phase() == job_phase::running);
  fx = core.go_on();  // the job goes on: worker 0 alone is at the barrier now
  REQUIRE(fx.released);
  CHECK(*fx.released == 4u);
  CHECK(fx.release_to == std::vector<std::uint32_t>{0});
}

TEST_CASE("coordinator_core: phases are named") {
  CHECK(std::string(to_string(job_phase::forming)) == "forming");
  CHECK(std::string(to_string(job_phase::stopping)) == "stopping");
  CHECK(std::string(to_string(job_phase::ending)) == "ending");
}
