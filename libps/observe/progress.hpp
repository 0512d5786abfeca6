// Training progress: what a worker reports (as JSON text, the payload of the observer's
// report messages) and what the job's observer makes of the reports of all workers:
// per-epoch summaries with an ETA, a live line, and the figures of --metrics lines.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "libps/observe/latency.hpp"

namespace ps {

struct progress_report {
  std::uint32_t worker = 0;
  std::uint64_t epoch = 0, epochs = 0;  // the epoch under way (1-based) and how many the job runs
  std::uint64_t clock = 0, clocks = 0;  // this worker's clocks done and planned (0: not known ahead)
  std::uint64_t samples = 0;            // trained on by this worker so far
  double loss = 0;                      // mean minibatch loss since the worker's last report
  bool epoch_end = false;               // the report that closes `epoch`
  double epoch_loss = 0;                // epoch_end: mean minibatch loss over the epoch
  std::string metric;                   // epoch_end: "accuracy" or "auc" when evaluated, else ""
  double metric_value = 0;
  std::uint64_t metric_count = 0;       // test samples behind metric_value (its weight)
  // Request latencies since the worker's last report (count 0: none measured).
  latency_summary push_latency, pull_latency;
  // Lookups in this worker's row cache since it started (both 0: it has none).
  std::uint64_t cache_hits = 0, cache_misses = 0;

  std::string to_json() const;
  // nullopt when the text is not a progress report (an app's free-form line).
  static std::optional<progress_report> parse(const std::string& text);
};

// A worker's side: sums the losses and says when a report is due.
class progress_tracker {
 public:
  // clocks_per_epoch 0: not known ahead (streamed data).
  progress_tracker(std::uint32_t worker, std::uint64_t epochs, std::uint64_t clocks_per_epoch, double every_s)
      : worker_(worker), epochs_(epochs), clocks_per_epoch_(clocks_per_epoch), every_s_(every_s) {}
  // After a minibatch of `epoch` (1-based) that made `clock` clocks done: a report when
  // every_s has passed since the last one.
  std::optional<progress_report> step(std::uint64_t epoch, std::uint64_t clock, std::uint64_t samples, double loss,
                                       double now_s);
  // The report that closes `epoch`; metric "" when this worker did not evaluate.
  progress_report close_epoch(std::uint64_t epoch, std::uint64_t clock, std::uint64_t samples,
                              const std::string& metric = "", double value = 0, std::uint64_t count = 0);

 private:
  progress_report base(std::uint64_t epoch, std::uint64_t clock, std::uint64_t samples) const;
  std::uint32_t worker_;
  std::uint64_t epochs_, clocks_per_epoch_;
  double every_s_, last_s_ = 0;
  double window_sum_ = 0, epoch_sum_ = 0;
  std::uint64_t window_n_ = 0, epoch_n_ = 0;
};

struct epoch_summary {
  std::uint64_t epoch = 0, epochs = 0;
  double loss = 0;  // mean of the workers' epoch losses
  std::string metric;
  std::optional<double> metric_value;  // weighted by the workers' test samples
  double samples_per_s = 0;            // all workers, over this epoch
  double elapsed_s = 0;                // since the job's first report
  double eta_s = 0;                    // the rest at this epoch's pace
  std::string text() const;            // "epoch 2/5: loss 0.4312, accuracy 0.8210, ..."
  std::optional<double> worker_cache_hit_rate;  // the workers' row caches since the start
  nlohmann::ordered_json json() const;  // a --metrics line ("type":"epoch")
};

class progress_board {
 public:
  explicit progress_board(std::uint32_t workers) : workers_(workers) {}
  // A report at `elapsed_s` of the job; returns the epochs it completes, in order (an
  // epoch is complete once every worker still training has closed it).
  std::vector<epoch_summary> add(const progress_report& r, double elapsed_s);
  // A worker that finished or died no longer holds epochs back.
  std::vector<epoch_summary> worker_left(std::uint32_t worker, double elapsed_s);
  // "epoch 2/5 41% | loss 0.43 | 55,012 samples/s | ETA 12 s" ("" before any report).
  std::string live_line(double elapsed_s) const;
  // The figures of a periodic --metrics line ("type":"progress"): the workers' latest
  // reports (their clocks are sampled at different times: the coordinator's are exact).
  nlohmann::ordered_json snapshot(double elapsed_s) const;

 private:
  void add_latencies(nlohmann::ordered_json& j) const;
  struct epoch_parts {
    std::map<std::uint32_t, progress_report> closed;  // by worker
  };
  std::vector<epoch_summary> complete(double elapsed_s);
  double fraction_done() const;

  std::uint32_t workers_;
  std::map<std::uint32_t, progress_report> latest_;  // by worker
  std::map<std::uint32_t, bool> gone_;
  std::map<std::uint64_t, epoch_parts> open_;  // epochs some worker has closed, not all
  std::uint64_t summarized_ = 0;               // epochs summarized so far
  std::uint64_t samples_at_last_summary_ = 0;
  double elapsed_at_last_summary_ = 0;
};

}  // namespace ps
