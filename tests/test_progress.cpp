// Progress reports and the observer's board (libps/observe/progress): per-epoch summaries, ETA,
// the live line and the periodic metrics figures.
#include <doctest/doctest.h>

#include "libps/observe/progress.hpp"

using ps::progress_board;
using ps::progress_report;

namespace {

progress_report closing(std::uint32_t worker, std::uint64_t epoch, std::uint64_t samples, double loss,
                        double accuracy, std::uint64_t tested) {
  progress_report r;
  r.worker = worker;
  r.epoch = epoch;
  r.epochs = 4;
  r.clock = epoch * 10;
  r.clocks = 40;
  r.samples = samples;
  r.loss = r.epoch_loss = loss;
  r.epoch_end = true;
  r.metric = "accuracy";
  r.metric_value = accuracy;
  r.metric_count = tested;
  return r;
}

}  // namespace

TEST_CASE("progress: a report goes through its JSON text unchanged; other lines are not reports") {
  auto r = closing(1, 2, 640, 0.5, 0.75, 5000);
  auto back = progress_report::parse(r.to_json());
  REQUIRE(back);
  CHECK(back->worker == 1);
  CHECK(back->epoch == 2);
  CHECK(back->clocks == 40);
  CHECK(back->samples == 640);
  CHECK(back->epoch_end);
  CHECK(back->metric == "accuracy");
  CHECK(back->metric_value == 0.75);
  CHECK(back->metric_count == 5000);
  CHECK_FALSE(progress_report::parse("clock 12"));
  CHECK_FALSE(progress_report::parse("{\"progress\":1,\"worker\":\"x\"}"));
  CHECK_FALSE(progress_report::parse("{\"progress\":1,"));
}

TEST_CASE("progress: an epoch is summarized once every worker closed it: mean loss, weighted metric, rate, ETA") {
  progress_board board(2);
  CHECK(board.add(closing(0, 1, 1000, 0.6, 0.80, 5000), 10).empty());  // worker 1 is still in epoch 1
  auto done = board.add(closing(1, 1, 1000, 0.4, 0.70, 3000), 10);
  REQUIRE(done.size() == 1);
  CHECK(done[0].epoch == 1);
  CHECK(done[0].loss == doctest::Approx(0.5));
  CHECK(*done[0].metric_value == doctest::Approx((0.8 * 5000 + 0.7 * 3000) / 8000));
  CHECK(done[0].samples_per_s == doctest::Approx(200));  // 2000 samples in 10 s
  CHECK(done[0].eta_s == doctest::Approx(30));           // 3 more epochs at 10 s each
  CHECK(done[0].text().find("epoch 1/4: loss 0.5000, accuracy 0.7625") == 0);
  CHECK(done[0].json()["accuracy"] == doctest::Approx(0.7625));
  // Epoch 2 takes 5 s: the ETA follows the latest pace.
  board.add(closing(1, 2, 2000, 0.3, 0.8, 3000), 15);
  done = board.add(closing(0, 2, 2000, 0.3, 0.8, 5000), 15);
  REQUIRE(done.size() == 1);
  CHECK(done[0].samples_per_s == doctest::Approx(400));
  CHECK(done[0].eta_s == doctest::Approx(10));
}

TEST_CASE("progress: a worker that leaves no longer holds epochs back") {
  progress_board board(2);
  board.add(closing(0, 1, 1000, 0.6, 0.8, 5000), 10);
  auto done = board.worker_left(1, 11);
  REQUIRE(done.size() == 1);
  CHECK(done[0].loss == doctest::Approx(0.6));
  CHECK(*done[0].metric_value == doctest::Approx(0.8));
}

TEST_CASE("progress: the live line and the snapshot say how far the job is") {
  progress_board board(2);
  CHECK(board.live_line(1).empty());
  progress_report a;
  a.worker = 0, a.epoch = 1, a.epochs = 2, a.clock = 10, a.clocks = 40, a.samples = 640, a.loss = 1.0;
  progress_report b = a;
  b.worker = 1, b.clock = 30, b.samples = 1920, b.loss = 0.5;
  board.add(a, 4);
  board.add(b, 4);
  auto snap = board.snapshot(4);
  CHECK(snap["samples"] == 2560);
  CHECK(snap["samples_per_s"] == doctest::Approx(640));
  CHECK(snap["fraction_done"] == doctest::Approx(0.5));
  CHECK(board.live_line(4) == "epoch 1/2  50% | loss 0.7500 | 640 samples/s | ETA 4 s");
}

TEST_CASE("progress: a worker's tracker reports at its interval with the window's mean loss, and closes epochs") {
  ps::progress_tracker t(3, 2, 10, 0.5);
  CHECK_FALSE(t.step(1, 1, 64, 2.0, 0.1));
  auto r = t.step(1, 2, 128, 1.0, 0.6);
  REQUIRE(r);
  CHECK(r->worker == 3);
  CHECK(r->loss == doctest::Approx(1.5));  // both minibatches since the start
  CHECK(r->clocks == 20);
  CHECK_FALSE(t.step(1, 3, 192, 0.5, 0.7));
  auto end = t.close_epoch(1, 3, 192, "accuracy", 0.9, 5000);
  CHECK(end.epoch_end);
  CHECK(end.epoch_loss == doctest::Approx(3.5 / 3));  // every minibatch of the epoch
  CHECK(end.metric_count == 5000);
  t.step(2, 4, 256, 0.25, 0.8);
  CHECK(t.close_epoch(2, 4, 256).epoch_loss == doctest::Approx(0.25));
}

TEST_CASE("latency: p50 and p99 from the recorded requests, within a bucket (19%); take starts afresh") {
  ps::latency_recorder rec;
  CHECK(rec.take().count == 0);
  for (int i = 0; i < 98; ++i) rec.record(1000);  // 1 ms
  rec.record(50000);                               // 50 ms, twice: the 99th percentile
  rec.record(50000);
  auto s = rec.take();
  CHECK(s.count == 100);
  CHECK(s.p50_ms == doctest::Approx(1.0).epsilon(0.19));
  CHECK(s.p99_ms == doctest::Approx(50.0).epsilon(0.19));
  CHECK(rec.take().count == 0);
}

TEST_CASE("progress: request latencies go through a report's JSON; the board shows the median p50 and the worst p99") {
  ps::progress_report a;
  a.worker = 0;
  a.epochs = 1;
  a.push_latency = {10, 1.0, 5.0};
  a.pull_latency = {10, 2.0, 9.0};
  auto back = ps::progress_report::parse(a.to_json());
  REQUIRE(back);
  CHECK(back->push_latency.count == 10);
  CHECK(back->pull_latency.p99_ms == 9.0);
  ps::progress_report b = a;
  b.worker = 1;
  b.push_latency = {10, 3.0, 20.0};
  b.pull_latency = {};  // none measured
  ps::progress_board board(2);
  board.add(a, 1.0);
  board.add(b, 1.0);
  auto j = board.snapshot(1.0);
  CHECK(j["push_p99_ms"] == 20.0);
  CHECK(j["push_p50_ms"] == 3.0);  // the upper median of {1, 3}
  CHECK(j["pull_p99_ms"] == 9.0);
}

TEST_CASE("progress: a job resumed at epoch 3 of 3 is summarized from there") {
  ps::progress_board board(1);
  ps::progress_report r;
  r.epoch = 3;
  r.epochs = 3;
  r.samples = 100;
  CHECK(board.add(r, 1.0).empty());
  r.epoch_end = true;
  r.epoch_loss = 0.5;
  auto done = board.add(r, 2.0);
  REQUIRE(done.size() == 1);
  CHECK(done[0].epoch == 3);
}

TEST_CASE("progress: the workers' row-cache lookups go through a report and are a hit rate over all workers") {
  auto a = closing(0, 1, 100, 0.5, 0.8, 10);
  a.cache_hits = 30;
  a.cache_misses = 10;
  auto back = progress_report::parse(a.to_json());
  REQUIRE(back);
  CHECK(back->cache_hits == 30);
  CHECK(back->cache_misses == 10);
  auto b = closing(1, 1, 100, 0.5, 0.8, 10);
  b.cache_misses = 60;  // all lookups missed
  progress_board board(2);
  CHECK(board.add(a, 1.0).empty());
  auto done = board.add(b, 2.0);
  REQUIRE(done.size() == 1);
  REQUIRE(done[0].worker_cache_hit_rate);
  CHECK(*done[0].worker_cache_hit_rate == doctest::Approx(0.3));
  CHECK(done[0].json()["worker_cache_hit_rate"] == doctest::Approx(0.3));
  CHECK(board.snapshot(2.0)["worker_cache_hit_rate"] == doctest::Approx(0.3));
  // Without caches there is no rate rather than a zero.
  progress_board plain(1);
  auto done_plain = plain.add(closing(0, 1, 100, 0.5, 0.8, 10), 1.0);
  REQUIRE(done_plain.size() == 1);
  CHECK_FALSE(done_plain[0].json().contains("worker_cache_hit_rate"));
}
